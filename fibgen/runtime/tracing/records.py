"""Recording a call on the calling thread: what is checked, kept, copied and queued.

Note [tracing memory]
The calling thread only copies the tensors it must dump (``clone()``, or an asynchronous copy
to the host for CUDA tensors) and appends to a queue; the writer thread serializes. Records
waiting in the queue are capped by count and by the bytes of their tensors: past either
cap a record is dropped and counted, and the first drop warns. Records that a dedup policy
filters out are counted apart from drops.
"""

from __future__ import annotations

import collections
import itertools
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from fibgen.runtime.routing.api import Api


class PendingRecord:
    """One call waiting to be written: everything the writer needs, nothing live."""

    __slots__ = ("op_type", "definition", "axes", "inputs", "nbytes", "event")

    def __init__(
        self,
        op_type: str,
        definition: str,
        axes: dict[str, Any],
        inputs: dict[str, Any],
        nbytes: int,
        event: Any,
    ) -> None:
        self.op_type = op_type
        self.definition = definition
        self.axes = axes
        # name → ("random", None) | ("scalar", value) | ("tensor", copy)
        self.inputs = inputs
        self.nbytes = nbytes
        self.event = event  # a CUDA event that marks the copies done, or None


class Recorder:
    """The calling thread's side of a ``_Tracer`` (a base of it): record a call, or count it."""

    # Set by ``_Tracer.__init__``.
    checks: dict[str, Callable[[Sequence[Any]], str | None]]
    dump: Callable[[str, torch.Tensor], bool] | None
    keep: Callable[[str, dict[str, Any], dict[str, Any]], bool]
    filtering: bool
    max_bytes: int
    max_records: int
    queue: collections.deque[PendingRecord]
    lock: threading.RLock
    pending_bytes: int
    wake: threading.Event
    warned: set[str]
    recorded: itertools.count
    dropped: itertools.count
    filtered: itertools.count
    mismatched: itertools.count
    capturing: itertools.count

    if TYPE_CHECKING:
        # Defined by ``_Tracer``.
        def _warn_once(self, key: str, message: str) -> None: ...

    def record(self, api: Api, name: str, values: Sequence[Any]) -> None:
        """Queue one call's workload (or count it as mismatched, filtered or dropped)."""
        check = self.checks.get(name)
        if check is not None:
            problem = check(values)
            if problem is not None:
                next(self.mismatched)
                self._warn_once(
                    "mismatched",
                    f"a call of {name} does not match its definition: {problem}; such calls "
                    "are not recorded, and tracing_stats()['mismatched'] counts them",
                )
                return
        # Only a generated dispatcher's calls are traced, and it sets both.
        assert api.trace_axes is not None and api.op_type is not None
        axes = api.trace_axes(*values)
        if self.filtering:
            with self.lock:
                kept = self.keep(name, axes, dict(zip(api.inputs, values)))
            if not kept:
                next(self.filtered)
                return
        inputs: dict[str, Any] = {}
        dumped: list[tuple[str, torch.Tensor]] = []
        nbytes = 0
        dump = self.dump
        for input_name, value in zip(api.inputs, values):
            if isinstance(value, torch.Tensor):
                if dump is not None and dump(input_name, value):
                    dumped.append((input_name, value))
                    nbytes += value.numel() * value.element_size()
                else:
                    inputs[input_name] = ("random", None)
            elif value is not None:
                # An optional input left out is left out of the workload too.
                inputs[input_name] = ("scalar", value)
        if len(self.queue) >= self.max_records:
            self._drop("records")
            return
        event = None
        if dumped:
            cuda = any(t.is_cuda for _, t in dumped)
            if cuda and torch.cuda.is_current_stream_capturing():
                # A copy would be captured into the graph; the call is not recorded.
                next(self.capturing)
                self._warn_once(
                    "capturing",
                    f"a call of {name} made while a CUDA graph is captured is not recorded: a "
                    "copy of its tensors would be captured into the graph; "
                    "tracing_stats()['capturing'] counts them. To record such calls, trace "
                    "them outside capture (the eager warm-up), or dump no tensors (dump='none')",
                )
                return
            with self.lock:
                if self.pending_bytes + nbytes > self.max_bytes:
                    self._drop("bytes")
                    return
                self.pending_bytes += nbytes
            event = self._copy(dumped, inputs, cuda)
        if not self.queue:
            self.wake.set()
        self.queue.append(PendingRecord(api.op_type, name, axes, inputs, nbytes, event))
        next(self.recorded)

    def _copy(
        self, dumped: list[tuple[str, torch.Tensor]], inputs: dict[str, Any], cuda: bool
    ) -> Any:
        """Copy tensors into ``inputs``; return a CUDA event marking the copies done, or None."""
        for input_name, t in dumped:
            if t.is_cuda:
                copy = t.detach().to("cpu", non_blocking=True)
            else:
                copy = t.detach().clone()
            inputs[input_name] = ("tensor", copy)
        if not cuda:
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    def _drop(self, why: str) -> None:
        next(self.dropped)
        if why in self.warned:
            return
        self.warned.add(why)
        cap = (
            f"{self.max_records} pending records"
            if why == "records"
            else f"{self.max_bytes} bytes of pending tensors"
        )
        warnings.warn(
            f"fibgen tracing: the writer is behind by more than {cap}; calls are being "
            "recorded faster than they are written, and records are dropped (tracing_stats() "
            "counts them). Dump fewer tensors, deduplicate, or raise the cap.",
            RuntimeWarning,
            stacklevel=4,
        )
