"""Valid random inputs for a definition, from a few var-axis values.

``generate_inputs(spec, axes)`` makes every input of a definition: tensors of the declared
dtype and shape, filled as their generation hints say (``fibgen.format.hints`` lists the
kinds), then checks the definition's constraints by evaluating them.

Var axes the caller leaves out are derived, in this order of preference:
1. from constraints over axes only, ``len_indptr == batch_size + 1`` (solved for whichever
   side is unknown when the relation is linear), and inequalities such as
   ``topk <= max_num_pages * page_size`` (the smallest value from the default up that holds);
2. from hints: ``indptr(over=kv_indices)`` decides the length of ``kv_indices``,
   ``last_page_len`` the batch it covers, ``indices(below=num_pages)`` the axis it indexes;
3. otherwise ``DEFAULT_VAR_AXIS``.

The parts: ``input_specs`` (what generation knows of a definition), ``input_generator`` (the
var axes, the order of the inputs, the constraints), ``input_fills`` (each input as its hint
says) and ``input_sizes`` (whether the inputs fit in memory).

Note [generator on CPU]: values are drawn on the CPU from one ``torch.Generator`` and then
moved to ``device``, so the same seed gives the same inputs on every device.
"""

from __future__ import annotations

from typing import Any

import torch

from fibgen.format.hints import DEFAULT_VAR_AXIS
from fibgen.runtime.inputs.generator import Generator
from fibgen.runtime.inputs.sizes import (
    available_memory,
    check_device_memory,
    estimate_nbytes,
    format_bytes,
)
from fibgen.runtime.inputs.specs import (
    Hint,
    InputGenerationError,
    InputSpec,
    parse_hint,
    torch_dtype,
)

__all__ = [
    "DEFAULT_VAR_AXIS",
    "Hint",
    "InputGenerationError",
    "InputSpec",
    "available_memory",
    "estimate_nbytes",
    "format_bytes",
    "generate_inputs",
    "generate_inputs_with_axes",
    "parse_hint",
    "torch_dtype",
]


def generate_inputs(
    spec: InputSpec, axes: dict[str, int] | None = None, *, device: Any = "cpu", seed: int = 0
) -> dict[str, Any]:
    """Make valid inputs for ``spec`` at the given var-axis values (others are derived)."""
    return generate_inputs_with_axes(spec, axes, device=device, seed=seed)[0]


def generate_inputs_with_axes(
    spec: InputSpec, axes: dict[str, int] | None = None, *, device: Any = "cpu", seed: int = 0
) -> tuple[dict[str, Any], dict[str, int]]:
    """Like ``generate_inputs``, also returning every axis value (given, const and derived)."""
    gen = Generator(spec, dict(axes or {}), seed)
    values = gen.run()
    dev = torch.device(device)
    if dev.type != "cpu":
        check_device_memory(spec, values, dev)
        values = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in values.items()}
    return values, dict(gen.axes)
