"""Writing a dataset: atomic replacement, JSONL appends that survive a torn line, each record."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable
from pathlib import Path

from fibgen.format.dataset.layout import (
    PathLike,
    definition_path,
    inside_dataset,
    solution_path,
    trace_path,
    workload_path,
)
from fibgen.format.dataset.sidecars import dump_extras, sidecar_path
from fibgen.format.errors import FormatWarning
from fibgen.format.jsonio import dump_definition, dump_solution, dump_trace_line
from fibgen.format.models import Definition, Solution, Trace, Workload
from fibgen.fsutil import lock_path, replace_atomically


def _guarded(path: PathLike, root: PathLike | None) -> Path:
    # Under a dataset root, every write goes through its guard (Note [confined paths] in
    # fibgen/fsutil.py): a link there must not send it, or the read before it, elsewhere.
    return Path(path) if root is None else inside_dataset(root, path, file=True)


def write_bytes_atomic(path: PathLike, data: bytes, *, root: PathLike | None = None) -> bool:
    """Write ``data`` to ``path`` atomically; return False when it already held exactly that.

    With ``root``, the dataset ``path`` lies in, a path that a symbolic link leads out of it
    is refused (FormatError).
    """
    path = _guarded(path, root)
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    replace_atomically(path, data, durable=True)
    return True


def write_text_atomic(path: PathLike, text: str, *, root: PathLike | None = None) -> bool:
    """Write UTF-8 ``text`` to ``path`` atomically; return False when unchanged (``root``: as
    ``write_bytes_atomic``)."""
    return write_bytes_atomic(path, text.encode("utf-8"), root=root)


# Note [torn lines]
# A JSONL writer stopped in the middle of a line (killed, out of disk; flashinfer-bench and
# the tracer append in place) leaves a last line without its newline that is not JSON.
# Appending after it would glue the next record to it and lose both, and a reader that stops
# at the first bad line would lose the whole file. So:
# - every appender here drops such a torn last line first and says so (it never was a
#   record: its writer did not finish it); a last line that is whole JSON without its
#   newline only gets the newline;
# - the tracer, which appends in place while other processes may append to the same file,
#   cannot cut the file: before each append it reads the last byte, and when it is not a
#   newline it starts with one, so its records are whole lines and the torn one stays a line
#   of its own (``_append`` in fibgen/runtime/tracing/writer.py). A line torn by another
#   writer between that read and the append can still take a record with it; closing that
#   needs a lock that every writer takes, and flashinfer-bench takes none;
# - readers read one line at a time, and skip a line that is not JSON with a FormatWarning
#   naming its file and line (``iter_records``): a torn line anywhere in a file costs that
#   line only. A line that is JSON but no record is an error (or goes to ``on_bad``).
#   ``fibgen validate`` calls a torn line an error, as flashinfer-bench refuses the file.


def _torn_tail(data: bytes) -> tuple[int, int] | None:
    """(offset, line number) of a torn last line of JSONL ``data``, or None (Note [torn lines])."""
    if not data or data.endswith(b"\n"):
        return None
    start = data.rfind(b"\n") + 1
    try:
        json.loads(data[start:].decode("utf-8"))
        return None
    except ValueError:  # not UTF-8 or not JSON: cut off mid-line
        return start, data.count(b"\n", 0, start) + 1


def _torn_message(data: bytes, torn: tuple[int, int]) -> str:
    return (
        f"dropped a torn last line ({len(data) - torn[0]} bytes, not JSON): its writer was "
        "stopped before finishing it"
    )


def drop_torn_last_line(path: PathLike, *, root: PathLike | None = None) -> str | None:
    """Drop a torn last line of a JSONL file (Note [torn lines]); what was done, or None.

    ``root``: as ``write_bytes_atomic``.
    """
    from filelock import FileLock

    path = _guarded(path, root)
    if not path.is_file():
        return None  # nothing to repair
    with FileLock(str(lock_path(path))):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        torn = _torn_tail(data)
        if torn is None:
            return None
        write_bytes_atomic(path, data[: torn[0]])
        return str(FormatWarning(path, _torn_message(data, torn), torn[1]))


def append_lines_atomic(
    path: PathLike, lines: Iterable[str], *, root: PathLike | None = None
) -> None:
    """Append lines (without newlines) to a JSONL file by atomically replacing it.

    A torn last line is dropped first, with a FormatWarning (Note [torn lines]). ``root``: as
    ``write_bytes_atomic``; the file is read before it is replaced, so a link to a file
    elsewhere would copy that file into the dataset.
    """
    from filelock import FileLock

    path = _guarded(path, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = "".join(line + "\n" for line in lines).encode("utf-8")
    if not new:
        return
    # Read-modify-replace loses lines when two writers race; the lock serializes them (its
    # file is kept out of the dataset: Note [lock files] in fibgen/fsutil.py).
    with FileLock(str(lock_path(path))):
        try:
            old = path.read_bytes()
        except FileNotFoundError:
            old = b""
        torn = _torn_tail(old)
        if torn is not None:
            warnings.warn(FormatWarning(path, _torn_message(old, torn), torn[1]), stacklevel=2)
            old = old[: torn[0]]
        elif old and not old.endswith(b"\n"):
            old += b"\n"
        write_bytes_atomic(path, old + new)


def write_definition(root: PathLike, defn: Definition, extras: dict | None = None) -> Path:
    """Write a definition to its place in the layout, and its sidecar when given; its path."""
    path = definition_path(root, defn.op_type, defn.name)
    if extras:
        # The sidecar first: a definition never sits without the hints it was made with.
        write_text_atomic(sidecar_path(path), dump_extras(extras), root=root)
    write_text_atomic(path, dump_definition(defn), root=root)
    return path


def write_solution(root: PathLike, solution: Solution, op_type: str) -> Path:
    """Write a solution to its place in the layout (the op_type of its definition)."""
    path = solution_path(root, solution.author, op_type, solution.definition, solution.name)
    write_text_atomic(path, dump_solution(solution), root=root)
    return path


def write_workloads(
    root: PathLike, op_type: str, definition: str, workloads: Iterable[Workload]
) -> Path:
    """Replace a definition's workload file with these workloads."""
    path = workload_path(root, op_type, definition)
    text = "".join(
        dump_trace_line(Trace(definition=definition, workload=w)) + "\n" for w in workloads
    )
    write_text_atomic(path, text, root=root)
    return path


def append_workloads(
    root: PathLike, op_type: str, definition: str, workloads: Iterable[Workload]
) -> Path:
    """Append workloads to a definition's workload file."""
    path = workload_path(root, op_type, definition)
    append_lines_atomic(
        path,
        (dump_trace_line(Trace(definition=definition, workload=w)) for w in workloads),
        root=root,
    )
    return path


def append_traces(root: PathLike, op_type: str, traces: Iterable[Trace]) -> list[Path]:
    """Append traces to ``traces/<op_type>/<definition>.jsonl``, one file per definition."""
    by_definition: dict[str, list[str]] = {}
    for trace in traces:
        by_definition.setdefault(trace.definition, []).append(dump_trace_line(trace))
    paths = []
    for definition, lines in by_definition.items():
        path = trace_path(root, op_type, definition)
        append_lines_atomic(path, lines, root=root)
        paths.append(path)
    return paths
