"""A worker's device: how its process is prepared to time solutions on it (Note [CPU
workers]), and how traces name the hardware and libraries it ran with."""

from __future__ import annotations

import os
import platform

import torch

__all__ = ["setup_device"]


def library_versions() -> dict[str, str]:
    libs: dict[str, str] = {"torch": str(torch.__version__)}
    try:
        import triton

        libs["triton"] = triton.__version__
    except ImportError:
        pass
    return libs


def hardware_name(device: torch.device) -> str:
    # As flashinfer-bench names it: the CPU model rather than "x86_64", so that traces of
    # both tools on one machine are of one hardware (Note [hardware strings]).
    from fibgen.runtime.selection.hardware import device_name

    return device_name(device)


# Note [CPU workers]
# Two things made CPU timings unusable (the same reference measured 0.13 ms at one batch size
# and 72 ms at the next):
#
# - torch's intra-op threads compete with every other process for the cores; when the cores
#   are busy, a parallel region waits for its slowest thread. A CPU worker runs torch with
#   one thread, so that the reference and each solution are timed alike and other load
#   changes their times by a factor of the load, not of hundreds.
# - glibc's malloc serves large blocks (a tensor of a few MB) with mmap and gives them back
#   on free, so each call faults its pages in again, until a free of a large block raises
#   the threshold: the same rmsnorm over 64 x 4096 measured 2.5 ms before that and 0.37 ms
#   after, depending on what ran earlier in the process. A CPU worker fixes the thresholds
#   high at its start (mallopt), so every call is served the same way.
#
# Triton kernels run on a CPU only under Triton's interpreter, whose switch is read when a
# kernel is decorated: it is set here, before any solution is imported, so `fibgen bench
# --devices cpu` runs Triton solutions without anything set by hand.

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def _steady_malloc() -> None:
    """Keep large blocks in the heap and the heap untrimmed (glibc only; Note [CPU workers])."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None or platform.system() != "Linux":
        return
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return  # not glibc: its allocator does something else
    for threshold in (1 << 30, 32 << 20):
        if mallopt(_M_MMAP_THRESHOLD, threshold):
            break
    mallopt(_M_TRIM_THRESHOLD, 1 << 30)


def setup_device(device: torch.device) -> None:
    """Prepare this process for running solutions on ``device`` (Note [CPU workers])."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
        return
    os.environ["TRITON_INTERPRET"] = "1"
    _steady_malloc()
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # only allowed before the first parallel work; one thread is enough
        pass
