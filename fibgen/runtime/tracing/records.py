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
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from fibgen.runtime import counters
from fibgen.runtime.caller import warn


class Recordable(Protocol):
    """What the recorder reads of what a call was made through: a generated dispatcher's
    API, or a definition that hand-written code names (tracing/handwritten.py)."""

    @property
    def inputs(self) -> Sequence[str]: ...

    @property
    def op_type(self) -> str | None: ...

    @property
    def trace_axes(self) -> Callable[..., dict[str, Any]] | None: ...


# The name of the thread that writes records (writer.py).
WRITER_THREAD = "fibgen-tracing"


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


class Pending:
    """The records waiting to be written: the recorder appends, the writer pops."""

    def __init__(self) -> None:
        self.records: collections.deque[PendingRecord] = collections.deque()
        # Reentrant: a signal handler that flushes may interrupt the thread holding it.
        self.lock = threading.RLock()
        self.bytes = 0  # of the tensors the records hold, under ``lock``
        self.wake = threading.Event()  # set when the first record is queued


class Counts:
    """What one tracing counts (``tracing_stats()``), and the warnings it gives once each."""

    # What tracing_stats() gives, in its order; all but "written" and "pending" are counters.
    STATS = (
        "recorded",
        "filtered",
        "dropped",
        "written",
        "failed",
        "pending",
        "unknown",
        "mismatched",
        "unplanned",
        "plan_changed",
        "refused",
        "capturing",
        "handwritten",
        "inner",
    )
    NAMES = tuple(name for name in STATS if name not in ("written", "pending"))

    def __init__(self) -> None:
        self.recorded = itertools.count()
        self.filtered = itertools.count()
        self.dropped = itertools.count()
        self.failed = itertools.count()
        # Calls not recorded, by reason (Note [missed calls] in tracer.py).
        self.unknown = itertools.count()
        self.mismatched = itertools.count()
        self.unplanned = itertools.count()
        self.plan_changed = itertools.count()
        self.refused = itertools.count()
        self.capturing = itertools.count()
        self.handwritten = itertools.count()
        # Calls of a definition made inside a recorded hand-written call of the same one.
        self.inner = itertools.count()
        self.written = 0  # by the writer thread only
        self.warned: set[str] = set()

    def tick(self, name: str) -> None:
        next(getattr(self, name))

    def read(self) -> dict[str, int]:
        counts = {name: counters.read(getattr(self, name)) for name in self.NAMES}
        counts["written"] = self.written
        return counts

    def warn_once(self, key: str, message: str, stacklevel: int | None = None) -> None:
        """Warn once per key, at the caller's line (Note [warnings at the caller]), or with
        ``stacklevel`` as ``warnings.warn``'s, counted from the caller."""
        if key in self.warned:
            return
        self.warned.add(key)
        if stacklevel is None:
            warn(f"fibgen tracing: {message}")
        else:
            warnings.warn(f"fibgen tracing: {message}", RuntimeWarning, stacklevel=stacklevel)

    def warn_failure(self, message: str) -> None:
        # Shown once, as the first failure's message. On the writer thread no frame is the
        # program's: the warning points at the writer's line that failed.
        text = f"{message} (further failures are counted in tracing_stats())"
        writer = threading.current_thread().name == WRITER_THREAD
        self.warn_once("write", text, stacklevel=3 if writer else None)


def mismatch_message(name: str | None, problem: str) -> str:
    """What tracing says of the first call whose inputs are not its definition's."""
    return (
        f"a call of {name} does not match its definition: {problem}; such calls are not "
        "recorded, and tracing_stats()['mismatched'] counts them"
    )


@dataclass(frozen=True)
class RecordPolicy:
    """What enable_tracing was told to keep: which tensors to dump (None: none), which calls
    to keep (``filtering``: whether ``keep`` may refuse any), and the caps on the queue."""

    dump: Callable[[str, torch.Tensor], bool] | None
    keep: Callable[[str, dict[str, Any], dict[str, Any]], bool]
    filtering: bool
    max_bytes: int
    max_records: int


class Recorder:
    """The calling thread's side of tracing: record a call into ``pending``, or count it."""

    def __init__(self, pending: Pending, counts: Counts, policy: RecordPolicy) -> None:
        self.pending = pending
        self.counts = counts
        self.policy = policy
        # Definition name -> the check of a call's inputs (Note [checked records]).
        self.checks: dict[str, Callable[[Sequence[Any]], str | None]] = {}
        # ``names``: the definitions of the hand-written calls this thread is inside, each
        # recorded already (Note [recorded hand-written calls] in handwritten.py).
        self.within = threading.local()

    def record(self, api: Recordable, name: str, values: Sequence[Any]) -> None:
        """Queue one call's workload (or count it as mismatched, filtered, dropped or inner)."""
        if name in getattr(self.within, "names", ()):
            next(self.counts.inner)
            return
        check = self.checks.get(name)
        if check is not None:
            problem = check(values)
            if problem is not None:
                next(self.counts.mismatched)
                self.counts.warn_once("mismatched", mismatch_message(name, problem))
                return
        # A generated dispatcher sets both; a hand-written call's target has both.
        assert api.trace_axes is not None and api.op_type is not None
        axes = api.trace_axes(*values)
        if self.policy.filtering:
            with self.pending.lock:
                kept = self.policy.keep(name, axes, dict(zip(api.inputs, values)))
            if not kept:
                next(self.counts.filtered)
                return
        inputs: dict[str, Any] = {}
        dumped: list[tuple[str, torch.Tensor]] = []
        nbytes = 0
        dump = self.policy.dump
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
        pending = self.pending
        if len(pending.records) >= self.policy.max_records:
            self._drop("records")
            return
        event = None
        if dumped:
            cuda = any(t.is_cuda for _, t in dumped)
            if cuda and torch.cuda.is_current_stream_capturing():
                # A copy would be captured into the graph; the call is not recorded.
                next(self.counts.capturing)
                self.counts.warn_once(
                    "capturing",
                    f"a call of {name} made while a CUDA graph is captured is not recorded: a "
                    "copy of its tensors would be captured into the graph; "
                    "tracing_stats()['capturing'] counts them. To record such calls, trace "
                    "them outside capture (the eager warm-up), or dump no tensors (dump='none')",
                )
                return
            with pending.lock:
                if pending.bytes + nbytes > self.policy.max_bytes:
                    self._drop("bytes")
                    return
                pending.bytes += nbytes
            event = self._copy(dumped, inputs, cuda)
        if not pending.records:
            pending.wake.set()
        pending.records.append(PendingRecord(api.op_type, name, axes, inputs, nbytes, event))
        next(self.counts.recorded)

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
        next(self.counts.dropped)
        cap = (
            f"{self.policy.max_records} pending records"
            if why == "records"
            else f"{self.policy.max_bytes} bytes of pending tensors"
        )
        self.counts.warn_once(
            why,
            f"the writer is behind by more than {cap}; calls are being recorded faster than "
            "they are written, and records are dropped (tracing_stats() counts them). Dump "
            "fewer tensors, deduplicate, or raise the cap.",
        )
