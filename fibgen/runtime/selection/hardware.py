"""Hardware: what a trace was measured on, what this process runs on, what can run here.

Note [hardware strings]
A trace's ``evaluation.environment.hardware`` is free text, written by whoever benchmarked:

- fibgen bench and flashinfer-bench 0.1.2 (``utils.hardware_from_device``) write, on a GPU,
  ``torch.cuda.get_device_name`` ("NVIDIA H100 80GB HBM3"); on a CPU, the ``model name`` of
  /proc/cpuinfo ("Intel(R) Xeon(R) Platinum 8480+"), else ``platform.processor()`` or
  ``platform.machine()``. fibgen before this note wrote ``platform.processor()`` or
  ``platform.machine()`` ("x86_64") on a CPU.
- Datasets written by hand or by other tools say "cpu", "NVIDIA H100", "NVIDIA_H100".

Strings are compared normalized: lowercase, every run of other characters than letters and
digits one space. A trace is from this machine when its string is one of this process's
names (on a GPU the current device's name; on a CPU the cpuinfo model name, the processor,
the machine and "cpu"), or when the words of one are the first words of the other ("NVIDIA
H100" and "NVIDIA H100 80GB HBM3"). Any other string is classified by its words as a CUDA
GPU ("nvidia", "tesla", "geforce", "quadro", "rtx", "gpu", "cuda", a known model such as
"h100"), a CPU ("cpu", "intel", "amd", "xeon", "epyc", "ryzen", an architecture such as
"x86 64"), or neither ("other": an AMD, Intel or Apple GPU, a TPU, anything unknown).

Latencies are compared only between traces of one hardware (fibgen/runtime/selection/table.py).
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

__all__ = [
    "Here",
    "device_name",
    "here",
    "kind_of",
    "language_problem",
    "normalize",
    "target_problem",
]

CPU, CUDA, OTHER = "cpu", "cuda", "other"

_CUDA_WORDS = {"nvidia", "tesla", "geforce", "quadro", "rtx", "cuda", "gpu"}
_CUDA_MODELS = re.compile(r"^(?:[abhlt]\d{1,3}|gb\d{2,3}|b\d{3}|v100|p100|k80|sm\d{2,3}a?)$")
_CPU_WORDS = {"cpu", "intel", "amd", "xeon", "epyc", "ryzen", "core", "arm", "neoverse"}
_CPU_ARCHES = {
    "x86 64",
    "amd64",
    "i386",
    "i686",
    "aarch64",
    "arm64",
    "ppc64le",
    "s390x",
    "riscv64",
}


def normalize(text: str) -> str:
    """A hardware string as it is compared: lowercase words of letters and digits."""
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def kind_of(text: str) -> str:
    """``cuda``, ``cpu`` or ``other``: what a hardware string (or target_hardware entry) names."""
    norm = normalize(text)
    words = set(norm.split())
    if words & {"apple", "mps", "xpu", "radeon", "instinct"} or (
        words & {"amd", "intel"} and "gpu" in words
    ):
        return OTHER  # a GPU, but not one CUDA code runs on
    if words & _CUDA_WORDS or any(_CUDA_MODELS.match(w) for w in words):
        return CUDA
    if words & _CPU_WORDS or norm in _CPU_ARCHES or norm.startswith("apple m"):
        return CPU
    return OTHER


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return None


def device_name(device: Any) -> str:
    """The hardware string a benchmark on ``device`` (a torch.device) records, as
    flashinfer-bench records it."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return _cpu_model() or platform.processor() or platform.machine() or "cpu"


@dataclass(frozen=True)
class Here:
    """The hardware of this process: its kind, and the names traces of it may carry."""

    kind: str
    names: tuple[str, ...]  # normalized
    # Whether Triton kernels can run: a GPU, or Triton's interpreter (not refused by
    # TRITON_INTERPRET=0) on a CPU.
    triton: bool = True

    @property
    def label(self) -> str:
        """How messages name it: the GPU's name, or "this CPU"."""
        return self.names[0] if self.kind == CUDA else "this CPU"

    def is_here(self, hardware: str) -> bool:
        """Whether a trace's hardware string names this machine (Note [hardware strings])."""
        norm = normalize(hardware)
        if not norm:
            return False
        for name in self.names:
            a, b = norm.split(), name.split()
            if a[: len(b)] == b or b[: len(a)] == a:
                return True
        return False

    def tier(self, hardware: str) -> int:
        """0: this machine; 1: hardware of this kind; 2: any other."""
        if self.is_here(hardware):
            return 0
        return 1 if kind_of(hardware) == self.kind else 2

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "names": list(self.names), "triton": self.triton}


@lru_cache(maxsize=1)
def _gpu_name() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(torch.cuda.current_device())


def here() -> Here:
    """This process's hardware (the current CUDA device when there is one)."""
    gpu = _gpu_name()
    if gpu is not None:
        return Here(CUDA, (normalize(gpu),))
    names = [_cpu_model(), platform.processor(), platform.machine(), "cpu"]
    unique = tuple(dict.fromkeys(normalize(n) for n in names if n and normalize(n)))
    return Here(CPU, unique, triton=os.environ.get("TRITON_INTERPRET", "").strip() != "0")


def language_problem(language: str, where: Here) -> str | None:
    """Why a solution of ``language`` cannot run on ``where``, or None."""
    if where.kind == CUDA:
        return None
    if language in ("cuda", "tilelang"):
        return f"{language} needs a CUDA GPU"
    if language == "triton" and not where.triton:
        return "triton needs a GPU, or its interpreter, which TRITON_INTERPRET=0 turns off"
    return None


def target_problem(target_hardware: Any, where: Here) -> str | None:
    """Why a solution declared for ``target_hardware`` is not for ``where``, or None.

    Only entries that name a kind count: one that names this kind, or none that names any,
    lets the solution run.
    """
    if not isinstance(target_hardware, list):
        return None
    kinds = {kind_of(str(t)) for t in target_hardware} - {OTHER}
    if not kinds or where.kind in kinds:
        return None
    return f"its target_hardware is {', '.join(map(str, target_hardware))}"
