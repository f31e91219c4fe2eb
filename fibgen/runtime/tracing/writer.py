"""Writing recorded calls into the dataset: workload lines, tensor blobs, definition files."""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from fibgen.runtime.tracing.records import WRITER_THREAD, Counts, Pending, PendingRecord

# How long the writer sleeps when nobody wakes it: bounds the delay before a record is on disk.
_WRITER_PERIOD_S = 0.05
_INPUTS_JSON_CACHE = 4096


class Writer:
    """The writer thread's side of tracing: the records in ``pending`` become files."""

    def __init__(self, root: Path, pending: Pending, counts: Counts) -> None:
        self.root = root
        self.pending = pending
        self.counts = counts
        # Definition name -> its JSON file beside the dispatcher (None: not found), filled
        # when a route is wrapped; names whose JSON the writer has put in the dataset.
        self.sources: dict[str, Path | None] = {}
        self.present: set[str] | None = None
        self.inputs_json: dict[tuple[str, tuple[tuple[str, Any], ...]], str] = {}
        self.write_lock = threading.RLock()
        # The thread inside drain(), so that a signal handler on it does not drain again.
        self.drainer: int | None = None
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name=WRITER_THREAD, daemon=True)

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.thread.start()

    def stop(self) -> None:
        """Stop the thread, then write what is left (on the calling thread)."""
        self.stopping = True
        self.pending.wake.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join()
        self.drain()

    def drain(self) -> None:
        """Write every queued record (on the calling thread; the writer does the same)."""
        with self.write_lock:
            self.drainer = threading.get_ident()
            try:
                self._drain_locked()
            finally:
                self.drainer = None

    def _run(self) -> None:
        wake = self.pending.wake
        while not self.stopping:
            wake.wait(_WRITER_PERIOD_S)
            wake.clear()
            self.drain()

    def _drain_locked(self) -> None:
        lines: dict[tuple[str, str], list[str]] = {}
        pending = self.pending
        while True:
            try:
                record = pending.records.popleft()
            except IndexError:
                break
            try:
                line = self._serialize(record)
            except Exception as exc:
                self._failed(record, exc)
                continue
            finally:
                if record.nbytes:
                    with pending.lock:
                        pending.bytes -= record.nbytes
            lines.setdefault((record.op_type, record.definition), []).append(line)
        for (op_type, definition), batch in lines.items():
            self._ensure_definition(definition, op_type)
            try:
                path = workload_file(self.root, op_type, definition)
                # Through the dataset's guard: a link there would send the lines elsewhere
                # (Note [confined paths] in fibgen/fsutil.py).
                _inside(self.root, path, file=True)
                # Any append may find a line torn by another process killed while writing it,
                # the tracer's earlier appends to the file notwithstanding (Note [torn lines]
                # in fibgen/format/dataset/writers.py).
                if _append(path, batch):
                    self.counts.warn_once(
                        f"torn {path}",
                        f"{path} did not end with a newline (a writer stopped mid-line?); "
                        "new records start on a line of their own",
                    )
                self.counts.written += len(batch)
            except (OSError, ValueError) as exc:
                for _ in batch:
                    next(self.counts.failed)
                self.counts.warn_failure(f"cannot write workloads of {definition}: {exc}")

    def _ensure_definition(self, name: str, op_type: str) -> None:
        """Put a definition's JSON and sidecar in the dataset (Note [complete datasets])."""
        if self.present is None:
            try:
                self.present = _definitions_in(self.root)
            except ValueError as exc:  # definitions/ leads out of the dataset
                self.present = set()
                self.counts.warn_failure(f"cannot read the definitions of {self.root}: {exc}")
        if name in self.present:
            return
        self.present.add(name)
        source = self.sources.get(name)
        if source is None:
            self.counts.warn_once(
                "definition",
                f"no definition JSON of {name} beside its dispatcher; its workloads are written "
                f"without it (copy it into {self.root}/definitions/ for fibgen bench)",
            )
            return
        from fibgen.format.dataset import sidecar_path, write_text_atomic

        try:
            # Under its op_type, as its workloads are (the source may lie in a flat folder).
            target = self.root / "definitions" / op_type / source.name
            sidecar = sidecar_path(source)
            if sidecar.is_file():
                text = sidecar.read_text(encoding="utf-8")
                write_text_atomic(sidecar_path(target), text, root=self.root)
            write_text_atomic(target, source.read_text(encoding="utf-8"), root=self.root)
        except (OSError, ValueError) as exc:
            self.counts.warn_failure(f"cannot write the definition of {name}: {exc}")

    def _serialize(self, record: PendingRecord) -> str:
        """The workload line of a record, after saving its blob (so a line's blob exists)."""
        workload_uuid = str(uuid.uuid4())
        tensors = {n: v for n, (kind, v) in record.inputs.items() if kind == "tensor"}
        inputs: str | None
        if tensors:
            if record.event is not None:
                record.event.synchronize()
            # Here rather than at import: the dataset's models (pydantic) stay out of a
            # serving process that only routes.
            from fibgen.format.dataset.blobs import save_blob

            relpath = save_blob(
                self.root, record.op_type, record.definition, workload_uuid, tensors
            )
            inputs = _inputs_json(record.inputs, relpath)
        else:
            # Calls of one definition mostly repeat their inputs' kinds and scalars: the
            # writer keeps pace with fast callers by reusing their JSON text.
            key: tuple[str, tuple[tuple[str, Any], ...]] | None
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

    def _failed(self, record: PendingRecord, exc: Exception) -> None:
        next(self.counts.failed)
        self.counts.warn_failure(
            f"cannot write a workload of {record.definition}: {type(exc).__name__}: {exc}"
        )


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


def _inside(root: Path, path: Path, file: bool = False) -> Path:
    """``path`` through the dataset's guard (Note [confined paths] in fibgen/fsutil.py)."""
    from fibgen.format.dataset import inside_dataset

    return inside_dataset(root, path, file=file)


def workload_file(root: Path, op_type: str, definition: str) -> Path:
    """Where a definition's workload lines go under ``root``."""
    from fibgen.format.dataset import workload_path

    return workload_path(root, op_type, definition)


def _append(path: Path, lines: list[str]) -> bool:
    """Append lines to a JSONL file, on a line of their own; whether it ended in a torn line.

    Other processes may be appending to the same file, so a torn last line (Note [torn lines]
    in fibgen/format/dataset/writers.py) is not cut: the new lines start after a newline, and
    the torn one stays a bad line that readers skip, naming its file and line. The last byte
    is read before every append, not only the first: another writer may die mid-line at any
    time, and one byte read costs nothing beside the write.
    """
    # One O_APPEND write per batch: processes tracing into one dataset do not tear lines.
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    torn = False
    try:
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
