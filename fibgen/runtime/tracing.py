"""Tracing: record the workloads of live calls as a FlashInfer Trace dataset.

``enable_tracing(dataset_dir)`` makes every generated dispatcher record the calls it sees:
the var-axis values and, per the dump policy, copies of the input tensors. Records become
workload lines in ``workloads/<op_type>/<definition>.jsonl`` and safetensors blobs in
``blob/workloads/<op_type>/<definition>/``, written by a background thread.
``FIBGEN_TRACE=1`` with ``FIBGEN_DATASET_PATH=<dir>`` enables it when ``fibgen.runtime`` is
imported (``FIBGEN_TRACE_DUMP`` and ``FIBGEN_TRACE_DEDUP`` choose the policies).

Note [complete datasets]
A traced dataset is one ``fibgen bench`` and flashinfer-bench can load: beside the first
workloads of a definition the writer puts its definition JSON and ``.fibgen`` sidecar
(found beside the dispatcher that made the call: ``<out>/definitions/`` of ``fibgen build
-o <out>``, or fibgen's built-in catalogue for ``fibgen_kernels``), unless the dataset has
that definition already. Only definitions that exist are recorded: a call whose const values
no instance declares (``rmsnorm`` at a hidden size of 1234) names a definition that has no
JSON, contract or reference, so it is not recorded; such calls are counted
(``tracing_stats()["unknown"]``) and the first one is reported.

Note [checked records]
A record is a workload of its definition only if the call's inputs are what the definition
declares: a [2, 3, 128] tensor routed to ``rmsnorm_h128`` by its last axis would be recorded
as ``batch_size=3``, a float32 input to a bfloat16 definition as a bfloat16 workload, and
bench would later refuse both. So before a call is recorded, every input tensor is checked
against the definition: its dtype, its rank, the size of each const axis, and that a var
axis has one size across the inputs that carry it. A call that fails is not recorded; it is
counted (``tracing_stats()["mismatched"]``) and the first one is reported with the reason.
The contract comes from the definition JSON found for the dataset (Note [complete
datasets]), else from the dispatcher's own tensor table (dtypes and ranks, no const sizes).

Note [tracing hooks]
Tracing costs nothing while it is off because it lives on the dispatcher's slow path. When it
turns on, ``set_tracer`` clears every dispatcher's routes and ``direct`` hook, so each
call goes through ``_api.resolve`` once per key, and ``resolve`` hands every new route to
``_wrap`` below. The wrapped route records, then calls what the route called before:

- an ``ORIGINAL`` route gets the API's own arguments; the generated ``_inputs`` function maps
  them to the definition's inputs (plan-time ones included);
- ``RETURNS``, ``DPS`` and ``INPLACE`` routes get the definition's inputs by keyword (and the
  output buffers, which the generated ``_var_axes`` ignores).

The generated ``_var_axes`` reads each var axis from the shape of an input that carries it,
as decided at generation time. Turning tracing off restores the routes and hooks.

Note [tracing memory]
The calling thread only copies the tensors it must dump (``clone()``, or an asynchronous copy
to the host for CUDA tensors) and appends to a queue; the writer thread serializes. Records
waiting in the queue are capped by count and by the bytes of their tensors: past either
cap a record is dropped and counted, and the first drop warns. Records that a dedup policy
filters out are counted apart from drops.
"""

from __future__ import annotations

import atexit
import collections
import glob
import itertools
import json
import os
import signal
import sys
import threading
import uuid
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import torch

from fibgen.runtime.env import enable_from_env
from fibgen.runtime.apply import ORIGINAL, Api, set_tracer

__all__ = [
    "TracingConfigError",
    "disable_tracing",
    "enable_tracing",
    "flush_tracing",
    "is_tracing",
    "tracing_stats",
]

DumpPolicy = Union[str, Sequence[str]]
DedupKey = Callable[[str, Mapping[str, int], Mapping[str, Any]], Hashable]
DedupPolicy = Union[str, tuple[str, int], DedupKey]

DEFAULT_MAX_PENDING_BYTES = 256 << 20
DEFAULT_MAX_PENDING_RECORDS = 65536
# How long the writer sleeps when nobody wakes it: bounds the delay before a record is on disk.
_WRITER_PERIOD_S = 0.05
_INPUTS_JSON_CACHE = 4096

_INT_DTYPES = frozenset(
    (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)
)


class TracingConfigError(ValueError):
    """A tracing option that cannot be used; the message says which and why."""


# ---------------------------------------------------------------------------------------
# Policies


def _dump_rule(dump: DumpPolicy) -> Callable[[str, torch.Tensor], bool] | None:
    """Which tensors to dump: a predicate over (input name, tensor); None dumps nothing."""
    if isinstance(dump, str):
        if dump == "none":
            return None
        if dump == "all":
            return lambda name, t: True
        if dump == "int":
            # Index tensors (indptr, indices) and flags: random data would make them invalid.
            return lambda name, t: t.dtype in _INT_DTYPES
        raise TracingConfigError(
            f"dump={dump!r}: use 'none', 'all', 'int' or a list of input names"
        )
    names = frozenset(dump)
    if not all(isinstance(n, str) and n for n in names):
        raise TracingConfigError(f"dump={dump!r}: a list of input names must hold names only")
    return lambda name, t: name in names


def _dedup_rule(dedup: DedupPolicy) -> Callable[[str, dict[str, Any], dict[str, Any]], bool]:
    """A predicate (definition, axes, inputs) → keep; it keeps state per definition."""
    seen: dict[tuple[str, Hashable], int] = {}

    def first(limit: int, key: Callable[[str, dict, dict], Hashable]) -> Callable[..., bool]:
        def keep(name: str, axes: dict[str, Any], inputs: dict[str, Any]) -> bool:
            k = (name, key(name, axes, inputs))
            n = seen.get(k, 0)
            if n >= limit:
                return False
            seen[k] = n + 1
            return True

        return keep

    def positive(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TracingConfigError(f"dedup={dedup!r}: the count must be a positive integer")
        return value

    if callable(dedup):
        return first(1, dedup)
    if dedup == "all":
        return lambda name, axes, inputs: True
    if dedup == "axes":
        return first(1, lambda name, axes, inputs: tuple(axes.items()))
    if isinstance(dedup, tuple) and len(dedup) == 2 and dedup[0] == "first":
        return first(positive(dedup[1]), lambda name, axes, inputs: None)
    if isinstance(dedup, tuple) and len(dedup) == 2 and dedup[0] == "axes":
        return first(positive(dedup[1]), lambda name, axes, inputs: tuple(axes.items()))
    raise TracingConfigError(
        f"dedup={dedup!r}: use 'all', 'axes', ('first', k), ('axes', k) or a function "
        "(definition, axes, inputs) -> key that keeps the first record per key"
    )


# ---------------------------------------------------------------------------------------
# The tracer


class _Record:
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


class _Tracer:
    """The state of one enable_tracing: policies, the queue, the writer thread, counters."""

    def __init__(
        self,
        root: Path,
        dump: Callable[[str, torch.Tensor], bool] | None,
        keep: Callable[[str, dict[str, Any], dict[str, Any]], bool],
        filtering: bool,
        max_bytes: int,
        max_records: int,
    ) -> None:
        self.root = root
        self.dump = dump
        self.keep = keep
        self.filtering = filtering
        self.max_bytes = max_bytes
        self.max_records = max_records
        self.queue: collections.deque[_Record] = collections.deque()
        # Reentrant: a signal handler that flushes may interrupt the thread holding it.
        self.lock = threading.RLock()
        self.write_lock = threading.RLock()
        self.pending_bytes = 0
        self.recorded = itertools.count()
        self.dropped = itertools.count()
        self.filtered = itertools.count()
        self.written = 0
        self.failed = itertools.count()
        # The thread inside drain(), so that a signal handler on it does not drain again.
        self.drainer: int | None = None
        self.pending_signal: tuple[int, Any] | None = None
        self.warned: set[str] = set()
        self.unknown = itertools.count()
        self.mismatched = itertools.count()
        # Workload files this tracer has appended to: their last line was checked.
        self.appended: set[Path] = set()
        # Definition name -> the check of a call's inputs (Note [checked records]).
        self.checks: dict[str, Callable[[Sequence[Any]], str | None]] = {}
        # Definition name -> its JSON file beside the dispatcher (None: not found), filled
        # when a route is wrapped; names whose JSON the writer has put in the dataset.
        self.sources: dict[str, Path | None] = {}
        self.present: set[str] | None = None
        self.inputs_json: dict[tuple[str, tuple[tuple[str, Any], ...]], str] = {}
        self.wake = threading.Event()
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="fibgen-tracing", daemon=True)

    # ------------------------------------------------------------ calling thread
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
                next(self.filtered)
                return
            with self.lock:
                if self.pending_bytes + nbytes > self.max_bytes:
                    self._drop("bytes")
                    return
                self.pending_bytes += nbytes
            event = self._copy(dumped, inputs, cuda)
        if not self.queue:
            self.wake.set()
        self.queue.append(_Record(api.op_type, name, axes, inputs, nbytes, event))
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

    # ------------------------------------------------------------- writer side
    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping:
            self.wake.wait(_WRITER_PERIOD_S)
            self.wake.clear()
            self.drain()

    def drain(self) -> None:
        """Write every queued record (on the calling thread; the writer does the same)."""
        with self.write_lock:
            self.drainer = threading.get_ident()
            try:
                self._drain_locked()
            finally:
                self.drainer = None
        signalled, self.pending_signal = self.pending_signal, None
        if signalled is not None:
            _on_signal(*signalled)

    def _drain_locked(self) -> None:
        lines: dict[tuple[str, str], list[str]] = {}
        while True:
            try:
                record = self.queue.popleft()
            except IndexError:
                break
            try:
                line = self._serialize(record)
            except Exception as exc:
                self._failed(record, exc)
                continue
            finally:
                if record.nbytes:
                    with self.lock:
                        self.pending_bytes -= record.nbytes
            lines.setdefault((record.op_type, record.definition), []).append(line)
        for (op_type, definition), batch in lines.items():
            self._ensure_definition(definition)
            try:
                path = workload_file(self.root, op_type, definition)
                # A file this tracer has not written yet may end in a line torn by a process
                # killed while writing it (Note [torn lines] in fibgen/format/dataset.py).
                if _append(path, batch, check_tail=path not in self.appended):
                    self._warn_once(
                        "torn",
                        f"{path} did not end with a newline (a writer stopped mid-line?); "
                        "new records start on a line of their own",
                    )
                self.appended.add(path)
                self.written += len(batch)
            except OSError as exc:
                for _ in batch:
                    next(self.failed)
                self._warn_failure(f"cannot write workloads of {definition}: {exc}")

    def _ensure_definition(self, name: str) -> None:
        """Put a definition's JSON and sidecar in the dataset (Note [complete datasets])."""
        if self.present is None:
            self.present = _definitions_in(self.root)
        if name in self.present:
            return
        self.present.add(name)
        source = self.sources.get(name)
        if source is None:
            self._warn_once(
                "definition",
                f"no definition JSON of {name} beside its dispatcher; its workloads are written "
                f"without it (copy it into {self.root}/definitions/ for fibgen bench)",
            )
            return
        from fibgen.format.dataset import sidecar_path, write_text_atomic

        try:
            target = self.root / "definitions" / source.parent.name / source.name
            sidecar = sidecar_path(source)
            if sidecar.is_file():
                write_text_atomic(sidecar_path(target), sidecar.read_text(encoding="utf-8"))
            write_text_atomic(target, source.read_text(encoding="utf-8"))
        except OSError as exc:
            self._warn_failure(f"cannot write the definition of {name}: {exc}")

    def _warn_once(self, key: str, message: str) -> None:
        if key in self.warned:
            return
        self.warned.add(key)
        warnings.warn(f"fibgen tracing: {message}", RuntimeWarning, stacklevel=2)

    def _serialize(self, record: _Record) -> str:
        """The workload line of a record, after saving its blob (so a line's blob exists)."""
        workload_uuid = str(uuid.uuid4())
        tensors = {n: v for n, (kind, v) in record.inputs.items() if kind == "tensor"}
        if tensors:
            if record.event is not None:
                record.event.synchronize()
            relpath = _save_blob(
                self.root, record.op_type, record.definition, workload_uuid, tensors
            )
            inputs = _inputs_json(record.inputs, relpath)
        else:
            # Calls of one definition mostly repeat their inputs' kinds and scalars: the
            # writer keeps pace with fast callers by reusing their JSON text.
            key = (record.definition, tuple(record.inputs.items()))
            try:
                inputs = self.inputs_json.get(key)
            except TypeError:  # a scalar of an unhashable type
                key, inputs = None, None
            if inputs is None:
                inputs = _inputs_json(record.inputs, None)
                if key is not None:
                    if len(self.inputs_json) >= _INPUTS_JSON_CACHE:
                        # Scalars that change on every call: reuse would not pay.
                        self.inputs_json.clear()
                    self.inputs_json[key] = inputs
        # Axis names are Python identifiers: nothing in them needs escaping.
        axes = ",".join(f'"{k}":{int(v)}' for k, v in record.axes.items() if v is not None)
        return (
            f'{{"definition":{json.dumps(record.definition)},"solution":null,'
            f'"workload":{{"uuid":"{workload_uuid}","axes":{{{axes}}},"inputs":{inputs}}},'
            '"evaluation":null}'
        )

    def _failed(self, record: _Record, exc: Exception) -> None:
        next(self.failed)
        self._warn_failure(
            f"cannot write a workload of {record.definition}: {type(exc).__name__}: {exc}"
        )

    def _warn_failure(self, message: str) -> None:
        if "write" in self.warned:
            return
        self.warned.add("write")
        # From the writer thread: the warning shows once, as the first failure's message.
        warnings.warn(
            f"fibgen tracing: {message} (further failures are counted in tracing_stats())",
            RuntimeWarning,
            stacklevel=2,
        )

    def stop(self) -> None:
        self.stopping = True
        self.wake.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join()
        self.drain()

    def stats(self) -> dict[str, int]:
        # repr is "count(N)": reading it does not advance the counter.
        def read(counter: itertools.count) -> int:
            return int(repr(counter)[6:-1])

        return {
            "recorded": read(self.recorded),
            "filtered": read(self.filtered),
            "dropped": read(self.dropped),
            "written": self.written,
            "failed": read(self.failed),
            "pending": len(self.queue),
            "unknown": read(self.unknown),
            "mismatched": read(self.mismatched),
        }


def _save_blob(
    root: Path, op_type: str, definition: str, workload_uuid: str, tensors: dict[str, Any]
) -> str:
    """Write a record's blob; return its path relative to the dataset root."""
    from safetensors.torch import save

    from fibgen.format.dataset import blob_relpath

    relpath = blob_relpath(op_type, definition, workload_uuid)
    path = root / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    # A new name per record, renamed into place: a reader never sees half a blob. No fsync:
    # losing recent records to a power cut is acceptable, a writer that lags is not.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(save({n: t.contiguous() for n, t in tensors.items()}))
    os.replace(tmp, path)
    return relpath


def _inputs_json(inputs: Mapping[str, tuple[str, Any]], relpath: str | None) -> str:
    specs: dict[str, Any] = {}
    for input_name, (kind, value) in inputs.items():
        if kind == "tensor":
            specs[input_name] = {"type": "safetensors", "path": relpath, "tensor_key": input_name}
        elif kind == "scalar":
            specs[input_name] = {"type": "scalar", "value": _scalar(value)}
        else:
            specs[input_name] = {"type": "random"}
    return json.dumps(specs, separators=(",", ":"), allow_nan=False)


def _scalar(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item()
    if isinstance(value, (bool, int, float)):
        return value
    # numpy scalars and the like: their Python value.
    return value.item() if hasattr(value, "item") else value


def workload_file(root: Path, op_type: str, definition: str) -> Path:
    """Where a definition's workload lines go under ``root``."""
    from fibgen.format.dataset import workload_path

    return workload_path(root, op_type, definition)


def _append(path: Path, lines: list[str], check_tail: bool = False) -> bool:
    """Append lines to a JSONL file; with ``check_tail``, first end a torn last line.

    Returns whether the file ended in a torn line (Note [torn lines] in
    fibgen/format/dataset.py). Other processes may be appending to the same file, so it
    is not cut: the new lines start on a line of their own, and the torn one stays a bad
    line that readers name by file and line.
    """
    # One O_APPEND write per batch: processes tracing into one dataset do not tear lines.
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    torn = False
    try:
        if check_tail:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                torn = True
                data = b"\n" + data
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    return torn


# ---------------------------------------------------------------------------------------
# Route wrapping (Note [tracing hooks])


def _definitions_in(root: Path) -> set[str]:
    """Names of the definitions a dataset holds (any depth; by file name and content)."""
    from fibgen.format.dataset import dataset_files

    names = set()
    for path in dataset_files(root, "definitions"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            names.add(data["name"])
    return names


def _definition_file(api: Api, name: str) -> Path | None:
    """The JSON of definition ``name`` beside the dispatcher of ``api`` (Note [complete datasets])."""
    module_name = getattr(api.function, "__module__", "") or ""
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if file:
        # <out>/python/<package>/<family>.py beside <out>/definitions/<op_type>/<name>.json
        base = Path(file).resolve().parents[2] / "definitions"
        if base.is_dir():
            found = sorted(base.glob(f"*/{glob.escape(name)}.json"))
            if found:
                return found[0]
    if module_name.split(".")[0] == "fibgen_kernels":
        from fibgen.paths import builtin_definition_file

        return builtin_definition_file(name)
    return None


def _contract(
    api: Api, source: Path | None
) -> tuple[list[tuple[str, str | None, tuple[str, ...]]], dict[str, int]]:
    """(name, dtype, shape) of each tensor input in ``api.inputs`` order, and the const axes'
    values: from the definition JSON when there is one, else the dispatcher's table."""
    if source is not None:
        try:
            data = json.loads(source.read_text(encoding="utf-8"))
            inputs = data["inputs"]
            if list(inputs) == list(api.inputs):
                tensors = [
                    (n, t.get("dtype"), tuple(t["shape"]))
                    for n, t in inputs.items()
                    if t.get("shape") is not None
                ]
                consts = {
                    a: int(spec["value"])
                    for a, spec in data.get("axes", {}).items()
                    if spec.get("type") == "const" and spec.get("value") is not None
                }
                return tensors, consts
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # the dispatcher's table still checks dtypes and ranks
    tensors = [
        (n, api.tensors[n][0], tuple(api.tensors[n][1])) for n in api.inputs if n in api.tensors
    ]
    return tensors, {}


def _input_check(api: Api, source: Path | None) -> Callable[[Sequence[Any]], str | None]:
    """The check of a call's input values against the definition (Note [checked records]):
    the reason of the first mismatch, or None."""
    from fibgen.runtime.inputs import torch_dtype

    tensors, consts = _contract(api, source)
    index = {n: i for i, n in enumerate(api.inputs)}
    wants: dict[str, torch.dtype | None] = {}
    for name, dtype, _ in tensors:
        try:
            wants[name] = torch_dtype(dtype) if dtype is not None else None
        except ValueError:  # a dtype this torch lacks: left unchecked
            wants[name] = None
    # A var axis is checked only where two dims carry it: alone, any size is its value.
    uses = collections.Counter(axis for _, _, shape in tensors for axis in shape)
    shared_axes = sorted(a for a, n in uses.items() if n > 1 and a not in consts)
    slots = {a: k for k, a in enumerate(shared_axes)}
    # Worked out once per definition, so that a call pays only comparisons; the reason is
    # worked out again, slowly, for a call that fails.
    plan = tuple(
        (
            index[name],
            wants[name],
            len(shape),
            tuple((d, consts[axis]) for d, axis in enumerate(shape) if axis in consts),
            tuple((d, slots[axis]) for d, axis in enumerate(shape) if axis in slots),
        )
        for name, _, shape in tensors
    )
    empty = [None] * len(slots)
    tensor = torch.Tensor

    def why(values: Sequence[Any]) -> str:
        return _mismatch(tensors, wants, consts, index, values)

    def check(values: Sequence[Any]) -> str | None:
        sizes = empty.copy() if empty else empty
        for i, want, rank, sized, shared in plan:
            value = values[i]
            if value is None:
                continue  # an optional input left out
            if not isinstance(value, tensor) or (want is not None and value.dtype is not want):
                return why(values)
            if value.ndim != rank:
                return why(values)
            if sized or shared:
                size = value.shape
                for d, expected in sized:
                    if size[d] != expected:
                        return why(values)
                for d, k in shared:
                    first = sizes[k]
                    if first is None:
                        sizes[k] = size[d]
                    elif first != size[d]:
                        return why(values)
        return None

    return check


def _mismatch(
    tensors: list[tuple[str, str | None, tuple[str, ...]]],
    wants: Mapping[str, torch.dtype | None],
    consts: Mapping[str, int],
    index: Mapping[str, int],
    values: Sequence[Any],
) -> str:
    """Why a call's inputs do not match the definition, said as the launchers say it."""
    seen: dict[str, tuple[int, str, int]] = {}
    for name, dtype, shape in tensors:
        value = values[index[name]]
        if value is None:
            continue
        if not isinstance(value, torch.Tensor):
            return f"input {name} is a {type(value).__name__}, not a tensor"
        want = wants[name]
        if want is not None and value.dtype is not want:
            got = str(value.dtype).removeprefix("torch.")
            return f"input {name} is {got}, the definition's is {dtype}"
        if value.ndim != len(shape):
            return (
                f"input {name} has {value.ndim} dims, the definition's has {len(shape)} "
                f"[{', '.join(shape)}]"
            )
        for d, axis in enumerate(shape):
            size = int(value.shape[d])
            if axis in consts and size != consts[axis]:
                return (
                    f"input {name} has size {size} along axis {axis} (dim {d}), the "
                    f"definition's is {consts[axis]}"
                )
            first = seen.setdefault(axis, (size, name, d))
            if first[0] != size:
                return (
                    f"input {name} has size {size} along axis {axis} (dim {d}), expected "
                    f"{first[0]} as in {first[1]} (dim {first[2]})"
                )
    return "its inputs differ from the definition's"  # not reached: check() found one


def _wrap(tracer: _Tracer) -> Callable[[Api, str | None, Any], Any]:
    def wrap(api: Api, name: str | None, route: Any) -> Any:
        kind, fn, tick, values = route
        if api.trace_inputs is None or name is None or fn is api.then:
            # Hand-written routes, calls this family cannot name, and calls passed on to the
            # next family of the same API (which records them itself).
            return route
        if name not in api.known_names:
            return (kind, _uncounted(tracer, api, name, fn), tick, values)
        if name not in tracer.sources:
            tracer.sources[name] = _definition_file(api, name)
        if name not in tracer.checks:
            tracer.checks[name] = _input_check(api, tracer.sources[name])
        record = tracer.record
        if kind == ORIGINAL:
            to_inputs = api.trace_inputs

            def traced_original(*args: Any, **kwargs: Any) -> Any:
                try:
                    record(api, name, to_inputs(*args, **kwargs))
                except Exception as exc:
                    _record_failed(tracer, name, exc)
                return fn(*args, **kwargs)

            return (kind, traced_original, tick, values)
        names = api.inputs

        def traced(**kwargs: Any) -> Any:
            try:
                record(api, name, [kwargs[n] for n in names])
            except Exception as exc:
                _record_failed(tracer, name, exc)
            return fn(**kwargs)

        return (kind, traced, tick, values)

    return wrap


def _uncounted(tracer: _Tracer, api: Api, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A route of a definition that does not exist: counted, reported once, not recorded."""
    count = tracer.unknown.__next__

    def untraced(*args: Any, **kwargs: Any) -> Any:
        count()
        tracer._warn_once(
            "unknown",
            f"{api.label} was called for {name}, which is not a definition of its family "
            "(no instance declares those values); such calls are not recorded, and "
            "tracing_stats()['unknown'] counts them",
        )
        return fn(*args, **kwargs)

    return untraced


def _record_failed(tracer: _Tracer, name: str, exc: Exception) -> None:
    # Tracing must never break a call: count the failure and warn once.
    next(tracer.failed)
    tracer._warn_failure(f"cannot record a call of {name}: {type(exc).__name__}: {exc}")


# ---------------------------------------------------------------------------------------
# Enabling, flushing on exit and on signals

_lock = threading.RLock()
_tracer: _Tracer | None = None
_last_stats: dict[str, int] | None = None
_atexit_registered = False
# signal number → the handler that was installed before ours
_previous_handlers: dict[int, Any] = {}
_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_STATS = (
    "recorded",
    "filtered",
    "dropped",
    "written",
    "failed",
    "pending",
    "unknown",
    "mismatched",
)


def enable_tracing(
    dataset_dir: str | os.PathLike[str],
    *,
    dump: DumpPolicy = "none",
    dedup: DedupPolicy = "all",
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
    max_pending_records: int = DEFAULT_MAX_PENDING_RECORDS,
    patch: bool = False,
) -> None:
    """Record the workloads of calls through generated dispatchers into ``dataset_dir``.

    ``dump``: which input tensors to save ("none", "all", "int" for integer and bool
    tensors, or a list of input names); others are recorded as random. ``dedup``: which
    calls to keep per definition ("all", "axes" for the first per var-axis values,
    ("first", k), ("axes", k), or a function (definition, axes, inputs) -> key keeping the
    first call per key). ``patch``: also replace the real APIs (``flashinfer.norm.rmsnorm``)
    by their dispatchers while tracing, so that a program calling FlashInfer directly is
    recorded too; with apply off, each call still runs the original API. ``FIBGEN_TRACE=1``
    patches. Enabling again flushes and replaces the previous configuration.
    """
    global _tracer, _atexit_registered
    dump_rule = _dump_rule(dump)
    keep = _dedup_rule(dedup)
    for option, value in (
        ("max_pending_bytes", max_pending_bytes),
        ("max_pending_records", max_pending_records),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TracingConfigError(f"{option}={value!r}: must be an integer >= 0")
    root = Path(dataset_dir)
    if root.exists() and not root.is_dir():
        raise TracingConfigError(f"dataset folder {root} exists and is not a folder")
    tracer = _Tracer(root, dump_rule, keep, dedup != "all", max_pending_bytes, max_pending_records)
    with _lock:
        disable_tracing()
        try:
            tracer.start()
        except OSError as exc:
            raise TracingConfigError(f"cannot create dataset folder {root}: {exc}") from None
        _tracer = tracer
        set_tracer(_wrap(tracer), patch=patch)
        if not _atexit_registered:
            atexit.register(disable_tracing)
            _atexit_registered = True
        _install_signal_handlers()


def disable_tracing() -> None:
    """Stop recording; write every pending record before returning."""
    global _tracer, _last_stats
    with _lock:
        tracer = _tracer
        if tracer is None:
            return
        set_tracer(None)
        _tracer = None
        _restore_signal_handlers()
        tracer.stop()
        _last_stats = tracer.stats()


def flush_tracing() -> None:
    """Write every record queued so far (tracing stays on)."""
    tracer = _tracer
    if tracer is not None:
        tracer.drain()


def is_tracing() -> bool:
    """Whether tracing is on."""
    return _tracer is not None


def tracing_stats() -> dict[str, int]:
    """Counts of the current (or last) tracing: recorded, filtered, dropped, written, failed,
    pending, unknown (calls of definitions that do not exist, not recorded) and mismatched
    (calls whose inputs do not match their definition, not recorded)."""
    tracer = _tracer
    if tracer is not None:
        return tracer.stats()
    return dict(_last_stats or dict.fromkeys(_STATS, 0))


def _on_signal(signum: int, frame: Any) -> None:
    tracer = _tracer
    if tracer is not None:
        if tracer.drainer == threading.get_ident():
            # The signal interrupted a drain on this thread, holding records it popped: that
            # drain finishes them, then calls this handler again.
            tracer.pending_signal = (signum, frame)
            return
        # Waits for the writer thread to finish its batch, then writes the rest.
        tracer.drain()
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:
        # The default action (terminate): restore it and deliver the signal again.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_signal_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        # Python lets only the main thread set handlers; atexit and disable still flush.
        return
    for signum in _SIGNALS:
        current = signal.getsignal(signum)
        if current is _on_signal:
            continue
        _previous_handlers[signum] = signal.SIG_DFL if current is None else current
        signal.signal(signum, _on_signal)


def _restore_signal_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, previous in list(_previous_handlers.items()):
        # A handler installed after ours stays: it may chain to ours, which then only chains.
        if signal.getsignal(signum) is _on_signal:
            signal.signal(signum, previous)
            del _previous_handlers[signum]


# ---------------------------------------------------------------------------------------
# The environment


def _parse_dump(text: str) -> DumpPolicy:
    text = text.strip()
    if text in ("", "none", "all", "int"):
        return text or "none"
    return [n.strip() for n in text.split(",") if n.strip()]


def _parse_dedup(text: str) -> DedupPolicy:
    text = text.strip()
    kind, _, count = text.partition(":")
    if count:
        try:
            return (kind, int(count))
        except ValueError:
            raise TracingConfigError(
                f"FIBGEN_TRACE_DEDUP={text!r}: the count after ':' must be an integer"
            ) from None
    return text or "all"


def enable_from_environment() -> None:
    """Enable tracing from FIBGEN_TRACE / FIBGEN_DATASET_PATH; warn and stay off when wrong."""

    def enable(path: str) -> None:
        enable_tracing(
            path,
            dump=_parse_dump(os.environ.get("FIBGEN_TRACE_DUMP", "none")),
            dedup=_parse_dedup(os.environ.get("FIBGEN_TRACE_DEDUP", "all")),
            # The environment switch is for programs that call FlashInfer, not fibgen.
            patch=True,
        )

    enable_from_env(
        "FIBGEN_TRACE",
        "FIBGEN_DATASET_PATH",
        "dataset folder",
        "tracing",
        enable,
        (TracingConfigError,),
    )
