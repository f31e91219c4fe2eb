"""The best-solution table: from benchmark traces, which solution serves each call.

Per definition, the traces of one hardware are used: this machine's where it has any, else
another device of its kind, else any (Note [selection per hardware]); latencies of different
hardware are never compared. Traces are judged one by one, as flashinfer-bench judges them,
and safer (Note [selection beside flashinfer-bench] in ``select_table``): a solution that can
run on this device is a candidate at the var-axis keys where its traces passed (within the
policy's tolerances) and none failed; one with no failing trace at all is *trusted*, one
with some is *partial*. Of several traces of one solution on one workload and hardware, the
last one read counts: a solution repaired and benchmarked again is judged on what it is now.
Trace files as flashinfer-bench writes them (non-finite errors as strings, traces of absent
solutions, languages fibgen cannot run) are read without error (Note [reading traces]). The
table holds, per definition:

- ``ranking``: the trusted candidates by the geometric mean of their speedup over the
  reference, best first; the first is the definition's best;
- ``keys``: per var-axis key (the workload's var-axis values in declaration order), the
  candidate with the lowest median latency at that key, partial ones included;
- ``keyed["trusted"]``: per key, the fastest trusted candidate there (what "nearest" picks).

Speedups and latencies are end to end in an eager loop by default, GPU time with the
policy's ``metric="gpu"`` (Note [selection metric]).

``entries(root, config)`` turns the table into apply entries. A definition whose keys all
pick its best gets a plain entry: its calls cost what any solution's do. Only a definition
with per-key choices, or with partial candidates only, gets a keyed entry, which reads the
var axes off the inputs and calls the solution chosen for them; on a key that no passing
trace covers it follows the policy's ``on_miss``, with trusted solutions only: the
definition's best (``"best"``), the fastest trusted solution of the nearest traced key by the
sum of |log2| ratios of the axis values (``"nearest"``), the dispatcher's fallback, that is
the original API (``"fallback"``, through ``Decline``), or the definition's reference
(``"reference"``, slow: for checking); with no trusted solution, "best" and "nearest" fall
back too. A keyed entry takes either calling style from hand-written ``apply`` (Note [calling
styles] in ``solutions``), and its dataset's definitions give that call its reference.

The table is cached in ``$FIBGEN_CACHE_DIR/select/`` under a digest of its inputs (paths,
sizes and mtimes of the trace, solution and definition files, the configuration and this
process's hardware), and
rebuilt when they change. Nothing is imported or built at enable except the ``prebuild``
top solutions a policy asks for. This module imports neither pydantic nor the compiler.

The parts: ``select_policy`` (the Policy), ``select_table`` (reading traces and ranking) and
``select_entries`` (the entries apply calls); this module caches the table and says what it
cannot use.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeGuard

from fibgen.runtime.caller import warn
from fibgen.runtime.selection import hardware
from fibgen.runtime.selection.entries import entry_of, keyed_entry
from fibgen.runtime.selection.policy import Policy, normalize_config, policy_of
from fibgen.runtime.selection.table import ORIGINAL, build_ranking, build_table, trace_inputs
from fibgen.runtime.solutions import loading as solutions

__all__ = ["ORIGINAL", "Policy", "build_table", "entries", "load_table", "normalize_config"]

# Bumped when the table's layout changes, so that old cache files are not read.
TABLE_VERSION = 7  # 7: unused["bad_definitions"]


def _digest(root: Path, inputs: dict, config: dict[str, Policy], where: hardware.Here) -> str:
    payload = {
        "version": TABLE_VERSION,
        "root": str(root),
        "inputs": inputs,
        "config": {k: asdict(v) for k, v in sorted(config.items())},
        "hardware": where.as_dict(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _cache_file(root: Path) -> Path:
    return (
        solutions.cache_root().parent
        / "select"
        / f"{hashlib.sha256(str(root).encode()).hexdigest()[:24]}.json"
    )


def load_table(root: str | os.PathLike[str], config: Any = None) -> tuple[dict, bool]:
    """The table for ``root`` and ``config`` on this process's hardware, from the cache when
    current; (table, from_cache)."""
    root = Path(root).resolve()
    config = normalize_config(config)
    inputs = trace_inputs(root)
    where = hardware.here()
    digest = _digest(root, inputs, config, where)
    cache = _cache_file(root)
    try:
        cached = json.loads(cache.read_text(encoding="utf-8"))
        if cached.get("digest") == digest:
            return cached["table"], True
    except (OSError, ValueError):
        pass
    table = build_ranking(root, inputs, config, where)
    _write_cache(cache, {"digest": digest, "table": table})
    return table, False


def _write_cache(path: Path, data: dict) -> None:
    # A cache that cannot be written (read-only home) only costs the next enable a rebuild.
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, separators=(",", ":"))
        os.replace(tmp, path)
    except OSError:
        pass


def _examples(items: list[str]) -> str:
    shown = ", ".join(items[:3])
    return shown + (f", ... ({len(items) - 3} more)" if len(items) > 3 else "")


def unused_message(root: Path, table: dict) -> str | None:
    """What a dataset holds that apply cannot route, with counts and reasons; None if nothing."""
    unused = table.get("unused") or {}
    parts = []
    if unused.get("failed"):
        parts.append(
            f"{len(unused['failed'])} solution(s) failed at every var-axis key they were "
            f"benchmarked at ({_examples(unused['failed'])})"
        )
    if unused.get("tolerance"):
        parts.append(
            f"{len(unused['tolerance'])} solution(s) exceed the policy's atol/rtol "
            f"({_examples(unused['tolerance'])})"
        )
    if unused.get("unkeyable"):
        parts.append(
            f"{len(unused['unkeyable'])} solution(s) failed at some var-axis keys, so serve "
            "only the others, and their definition cannot be routed per key "
            f"({_examples(unused['unkeyable'])})"
        )
    if unused.get("untraced"):
        parts.append(
            f"{len(unused['untraced'])} solution(s) have no benchmark traces "
            f"({_examples(unused['untraced'])}; run `fibgen bench {root}`)"
        )
    if unused.get("missing"):
        parts.append(
            f"traces name {len(unused['missing'])} solution(s) not under {root}/solutions "
            f"({_examples(unused['missing'])})"
        )
    if unused.get("unreadable"):
        parts.append(
            f"{unused['unreadable']} file(s) under {root}/solutions are not Solution JSON "
            f"(`fibgen validate {root}` names them)"
        )
    if unused.get("bad_definitions"):
        parts.append(solutions.bad_definitions_message(root, unused["bad_definitions"]))
    if unused.get("slower"):
        parts.append(
            f"{len(unused['slower'])} definition(s) have no solution faster than the API's own "
            f"function, which keeps their calls ({_examples(unused['slower'])})"
        )
    where = table.get("hardware") or {}
    here = where.get("names", ["?"])[0] if where.get("kind") == "cuda" else "this CPU"
    if unused.get("not_here"):
        parts.append(
            f"{len(unused['not_here'])} solution(s) cannot run on {here} "
            f"({_examples(unused['not_here'])})"
        )
    if unused.get("other_hardware"):
        parts.append(
            f"{len(unused['other_hardware'])} solution(s) have traces only from other hardware "
            f"than their definition is ranked on ({_examples(unused['other_hardware'])}; "
            f"run `fibgen bench {root}` here)"
        )
    if unused.get("skipped_lines"):
        parts.append(
            f"{unused['skipped_lines']} line(s) under {root}/traces are not traces and were "
            f"skipped (`fibgen validate {root}` names them)"
        )
    notes = []
    if unused.get("partial"):
        notes.append(
            f"{len(unused['partial'])} solution(s) failed at some var-axis keys and serve only "
            f"the keys where they passed ({_examples(unused['partial'])})"
        )
    elsewhere = sorted(
        f"{name} ({info['hardware']})"
        for name, info in table.get("definitions", {}).items()
        if not info.get("measured_here", True)
    )
    if elsewhere:
        notes.append(
            f"{len(elsewhere)} definition(s) ranked on traces from other hardware than {here}, "
            f"which may rank otherwise here ({_examples(elsewhere)}; run `fibgen bench {root}` "
            "here)"
        )
    if unused.get("unknown_definitions"):
        notes.append(
            f"{len(unused['unknown_definitions'])} solution(s) are for definitions that neither "
            f"{root}/definitions nor fibgen's catalogue has "
            f"({_examples(unused['unknown_definitions'])}); only a dispatcher that knows the "
            "name can route them"
        )
    routed = len(table.get("definitions", {}))
    tail = "".join(f"; {n}" for n in notes)
    if routed == 0:
        head = (
            f"fibgen: {root}: nothing is routed: {unused.get('solution_files', 0)} solution "
            f"file(s), {unused.get('evaluated_traces', 0)} evaluated trace(s)"
        )
        return head + (": " + "; ".join(parts) if parts else "") + tail
    if not parts and not notes:
        return None
    message = f"fibgen: {root}: {routed} definition(s) routed"
    return message + ("; not usable: " + "; ".join(parts) if parts else "") + tail


def entries(root: str | os.PathLike[str], config: Any = None) -> dict[str, solutions.Entry]:
    """Apply entries for every definition the traces under ``root`` rank a solution for.

    What the dataset holds but cannot route (failing or untraced solutions, traces of
    solutions that are not there, solutions that cannot run on this device, lines that are not
    traces), solutions that serve only some keys and solutions for definitions nobody has are
    said in one RuntimeWarning.
    """
    root = Path(root).resolve()
    config = normalize_config(config)
    table, _ = load_table(root, config)
    message = unused_message(root, table)
    if message is not None:
        warn(message)
    out: dict[str, solutions.Entry] = {}
    for name, info in table["definitions"].items():
        policy = policy_of(config, name)
        if "keyed" in info:
            out[name] = keyed_entry(root, name, info, policy)
            continue
        best = info["ranking"][0]
        entry = entry_of(root, name, best, info["solutions"][best])
        if policy.prebuild:
            # Imported now (materialized and in sys.modules): the first call only binds it.
            solutions.load(entry, (), ())
        out[name] = entry
    return out


def is_traced_dataset(target: Any) -> TypeGuard[str | os.PathLike[str]]:
    """Whether ``enable_apply``'s argument is a dataset folder with benchmark traces."""
    return isinstance(target, (str, os.PathLike)) and os.path.isdir(os.path.join(target, "traces"))
