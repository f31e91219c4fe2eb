"""Whether inputs fit: their size in bytes, and the memory the host and the device have free."""

from __future__ import annotations

import math
import os
from typing import Any, cast

import torch

from fibgen.format.hints import DEFAULT_VAR_AXIS
from fibgen.format.models import DTYPE_BYTES
from fibgen.runtime.inputs.specs import InputGenerationError, InputSpec

# Note [input sizes]
# Var-axis values come from users and datasets: `--axes batch_size=100000000` asks for a
# 763 GiB tensor, and the allocator's answer is a traceback (or the OOM killer). So before
# each tensor is made its bytes are counted, and a tensor that would take the inputs past the
# memory the host has free is refused with the input's name, shape and size; the same holds
# for the device the inputs are moved to. The count leaves out the temporaries of a fill (a
# float32 draw converted to bfloat16): it refuses what cannot fit, never what might.


def available_memory() -> int | None:
    """Bytes the host can still give this process (MemAvailable, capped by RLIMIT_AS); None
    when the system does not say."""
    free = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        pass
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            free = None
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit != resource.RLIM_INFINITY:
            free = limit if free is None else min(free, limit)
    except (ImportError, OSError, ValueError):
        pass
    return free


def format_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit that keeps it at least 1: ``763.0 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def check_device_memory(spec: InputSpec, values: dict[str, Any], device: torch.device) -> None:
    """Refuse inputs that the device has no room for (Note [input sizes])."""
    if device.type != "cuda":
        return
    need = sum(v.numel() * v.element_size() for v in values.values() if isinstance(v, torch.Tensor))
    free, _ = torch.cuda.mem_get_info(device)
    if need > free:
        raise InputGenerationError(
            f"{spec.name}: the inputs take {format_bytes(need)}, more than the "
            f"{format_bytes(free)} free on {device}; give smaller var-axis values"
        )


def estimate_nbytes(spec: InputSpec, axes: dict[str, int] | None = None) -> int:
    """Rough size of the inputs in bytes; var axes not given count as ``DEFAULT_VAR_AXIS``."""
    # A const axis carries its value.
    known = {n: cast(int, v) for n, k, v in spec.axes if k == "const"}
    known.update(axes or {})
    total = 0
    for _, dtype, shape, _, _ in spec.inputs:
        if shape is None:
            continue
        numel = math.prod(known.get(dim, DEFAULT_VAR_AXIS) for dim in shape)
        total += numel * DTYPE_BYTES[dtype]
    return total
