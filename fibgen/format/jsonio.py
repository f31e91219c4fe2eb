"""Canonical JSON for the format's models, and parsing that reports errors as FormatError.

Canonical text is byte-identical for equal models: keys in a fixed order, 2-space indent for
JSON files, one compact line per JSONL record, ``ensure_ascii=False``, and a trailing newline
on files. A field whose value is None is left out, except a trace's ``solution`` and
``evaluation``, which a workload line writes as ``null`` (the format's convention).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar, Union

from pydantic import BaseModel, ValidationError

from fibgen.format.errors import (
    FormatError,
    FormatWarning,
    NotJSONError,
    format_loc,
    join_messages,
    unknown_key_messages,
    validation_messages,
)
from fibgen.format.models import (
    Definition,
    Evaluation,
    Solution,
    TensorSpec,
    Trace,
    Workload,
)
from fibgen.format.schema_walk import strip_unknown_keys

M = TypeVar("M", bound=BaseModel)
PathLike = Union[str, "os.PathLike[str]"]

# The most common key order in the dataset (69 of 156 definition files).
DEFINITION_KEY_ORDER: tuple[str, ...] = (
    "name",
    "description",
    "op_type",
    "tags",
    "axes",
    "constraints",
    "inputs",
    "outputs",
    "reference",
)

# ---------------------------------------------------------------------------------------
# Models -> JSON values


def _float(value: float) -> Union[float, str]:
    # JSON has no inf/nan; flashinfer-bench (pydantic ser_json_inf_nan="strings") writes these.
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _tensor_to_json(spec: TensorSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"shape": None if spec.shape is None else list(spec.shape)}
    out["dtype"] = spec.dtype
    if spec.description is not None:
        out["description"] = spec.description
    if spec.optional:
        out["optional"] = True
    return out


def definition_to_json(defn: Definition) -> dict[str, Any]:
    """A definition as a JSON object with keys in canonical order."""
    axes: dict[str, Any] = {}
    for name, axis in defn.axes.items():
        entry: dict[str, Any] = {"type": axis.type}
        if axis.type == "const":
            entry["value"] = axis.value
        if axis.description is not None:
            entry["description"] = axis.description
        axes[name] = entry
    out: dict[str, Any] = {"name": defn.name}
    if defn.description is not None:
        out["description"] = defn.description
    out["op_type"] = defn.op_type
    out["tags"] = list(defn.tags)
    out["axes"] = axes
    out["constraints"] = list(defn.constraints)
    out["inputs"] = {n: _tensor_to_json(t) for n, t in defn.inputs.items()}
    out["outputs"] = {n: _tensor_to_json(t) for n, t in defn.outputs.items()}
    out["reference"] = defn.reference
    return out


def solution_to_json(solution: Solution) -> dict[str, Any]:
    """A solution as a JSON object with keys in canonical order."""
    spec = solution.spec
    spec_json: dict[str, Any] = {
        "language": spec.language,
        "target_hardware": list(spec.target_hardware),
        "entry_point": spec.entry_point,
        "dependencies": list(spec.dependencies),
        "destination_passing_style": spec.destination_passing_style,
    }
    if spec.binding is not None:
        spec_json["binding"] = spec.binding
    out: dict[str, Any] = {
        "name": solution.name,
        "definition": solution.definition,
        "author": solution.author,
    }
    if solution.description is not None:
        out["description"] = solution.description
    out["spec"] = spec_json
    out["sources"] = [{"path": s.path, "content": s.content} for s in solution.sources]
    return out


def workload_to_json(workload: Workload) -> dict[str, Any]:
    """A workload as a JSON object with keys in canonical order."""
    inputs: dict[str, Any] = {}
    for name, spec in workload.inputs.items():
        if spec.type == "random":
            inputs[name] = {"type": "random"}
        elif spec.type == "scalar":
            inputs[name] = {"type": "scalar", "value": _json_safe(spec.value)}
        else:
            inputs[name] = {"type": "safetensors", "path": spec.path, "tensor_key": spec.tensor_key}
    return {"uuid": workload.uuid, "axes": dict(workload.axes), "inputs": inputs}


def evaluation_to_json(evaluation: Evaluation) -> dict[str, Any]:
    """An evaluation as a JSON object; inf/nan metrics become strings."""
    out: dict[str, Any] = {
        "status": evaluation.status.value,
        "environment": {
            "hardware": evaluation.environment.hardware,
            "libs": dict(evaluation.environment.libs),
        },
        "timestamp": evaluation.timestamp,
        "log": evaluation.log,
    }
    if evaluation.correctness is not None:
        c = evaluation.correctness
        correctness: dict[str, Any] = {
            "max_relative_error": _float(c.max_relative_error),
            "max_absolute_error": _float(c.max_absolute_error),
        }
        if c.extra is not None:
            correctness["extra"] = _json_safe(c.extra)
        out["correctness"] = correctness
    if evaluation.performance is not None:
        p = evaluation.performance
        out["performance"] = {
            "latency_ms": _float(p.latency_ms),
            "reference_latency_ms": _float(p.reference_latency_ms),
            "speedup_factor": _float(p.speedup_factor),
        }
        for key in (
            "e2e_latency_ms",
            "reference_e2e_latency_ms",
            "original_e2e_latency_ms",
            "original_latency_ms",
            "e2e_spread",
        ):
            if getattr(p, key) is not None:
                out["performance"][key] = _float(getattr(p, key))
        if p.e2e_routed is not None:
            out["performance"]["e2e_routed"] = p.e2e_routed
    return out


def trace_to_json(trace: Trace) -> dict[str, Any]:
    """A trace as a JSON object in the dataset's key order (definition, solution, ...)."""
    return {
        "definition": trace.definition,
        "solution": trace.solution,
        "workload": workload_to_json(trace.workload),
        "evaluation": None if trace.evaluation is None else evaluation_to_json(trace.evaluation),
    }


# ---------------------------------------------------------------------------------------
# Models -> text


def _dump_file(obj: Any) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def dump_json_file(obj: Mapping[str, Any]) -> str:
    """The file text of a JSON object already in canonical key order (2-space indent)."""
    return _dump_file(obj)


def _dump_line(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dump_definition(defn: Definition) -> str:
    """Canonical text of a definition file."""
    return _dump_file(definition_to_json(defn))


def dump_solution(solution: Solution) -> str:
    """Canonical text of a solution file."""
    return _dump_file(solution_to_json(solution))


def dump_workload(workload: Workload) -> str:
    """A workload as one compact JSON line (no newline)."""
    return _dump_line(workload_to_json(workload))


def dump_trace_line(trace: Trace) -> str:
    """A trace as one compact JSONL line (no newline)."""
    return _dump_line(trace_to_json(trace))


def dump_workload_line(definition: str, workload: Workload) -> str:
    """A workload line of ``workloads/...jsonl``: a trace with null solution and evaluation."""
    return dump_trace_line(Trace(definition=definition, workload=workload))


def dump_jsonl(traces: list[Trace]) -> str:
    """Canonical text of a JSONL file of traces."""
    return "".join(dump_trace_line(t) + "\n" for t in traces)


# ---------------------------------------------------------------------------------------
# Semantic equality of definitions


def _normalize_definition(obj: Union[Definition, Mapping[str, Any]]) -> dict[str, Any]:
    raw = definition_to_json(obj) if isinstance(obj, Definition) else dict(obj)
    out = {k: v for k, v in raw.items() if v is not None or k != "description"}
    out.setdefault("constraints", [])
    out.setdefault("tags", [])

    def entry(value: Any, drop_false: str | None = None) -> Any:
        if not isinstance(value, Mapping):
            return value
        return {
            k: v
            for k, v in value.items()
            if not (k == "description" and v is None) and not (k == drop_false and v is False)
        }

    # Order matters for these three maps (the calling convention), so compare item lists.
    for key, drop in (("axes", None), ("inputs", "optional"), ("outputs", "optional")):
        if isinstance(out.get(key), Mapping):
            out[key] = [(name, entry(v, drop)) for name, v in out[key].items()]
    return out


def semantic_equal(
    a: Union[Definition, Mapping[str, Any]], b: Union[Definition, Mapping[str, Any]]
) -> bool:
    """Whether two definitions (models or JSON objects) mean the same thing."""
    return _normalize_definition(a) == _normalize_definition(b)


# ---------------------------------------------------------------------------------------
# Text -> models


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            # json.loads would keep the last one silently; a curator wants to know.
            raise ValueError(f"duplicate key {json.dumps(key, ensure_ascii=False)}")
        out[key] = value
    return out


# Note [lone surrogates]
# JSON's \u escapes spell characters beyond U+FFFF as a pair of UTF-16 surrogates, and
# json.loads turns an escape of half a pair ("\ud800") into a Python string holding a lone
# surrogate, which is no character: UTF-8 cannot encode it. Such a file loaded and validated,
# and then every command that wrote it again (pack, bench packing a folder, workloads copying
# a definition, a trace naming a workload) died in a traceback; flashinfer-bench's loader
# refuses the file. So the readers refuse it, naming the file and the field.


def _surrogate_in(text: str) -> str | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return text[exc.start]
    return None


def _lone_surrogate(value: Any, loc: tuple = ()) -> tuple[str, str] | None:
    """Where a parsed JSON value holds a lone surrogate (a JSON path), and the surrogate;
    None if nowhere."""
    if isinstance(value, str):
        char = _surrogate_in(value)
        return None if char is None else (format_loc(loc), char)
    if isinstance(value, dict):
        for key, item in value.items():
            char = _surrogate_in(key)
            if char is not None:
                # The key as the file spells it (ASCII JSON): a terminal cannot show it raw.
                parent = format_loc(loc) + " " if loc else ""
                return f"{parent}key {json.dumps(key)}", char
            found = _lone_surrogate(item, (*loc, key))
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _lone_surrogate(item, (*loc, index))
            if found is not None:
                return found
    return None


def _refuse_lone_surrogates(value: Any, path: PathLike, line: int | None = None) -> Any:
    """``value``, unless a string in it holds a lone surrogate (Note [lone surrogates])."""
    found = _lone_surrogate(value)
    if found is not None:
        where, char = found
        raise FormatError(
            path,
            f"{where}: \\u{ord(char):04x} is half of a UTF-16 surrogate pair, no "
            "character: UTF-8 cannot store it, and flashinfer-bench refuses the file; write "
            "the character itself, or both halves of its pair",
            line,
        )
    return value


def parse_json(text: str, path: PathLike = "<string>") -> Any:
    """Parse JSON text, raising FormatError with line and column on a syntax error, and on a
    string that is no text (Note [lone surrogates])."""
    try:
        value = json.loads(text, object_pairs_hook=_reject_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise FormatError(path, f"invalid JSON: {exc.msg}", exc.lineno, exc.colno) from None
    except ValueError as exc:
        raise FormatError(path, str(exc)) from None
    return _refuse_lone_surrogates(value, path)


def validate_obj(
    model: type[M], obj: Any, path: PathLike = "<string>", line: int | None = None
) -> M:
    """Validate a parsed JSON value as ``model``, raising FormatError on any problem.

    Keys the model does not know are dropped, as flashinfer-bench drops them, with a
    FormatWarning naming each; when the value is wrong anyway they are listed with the
    problems, since a misspelt key is the usual cause of a missing one.
    """
    # The models forbid unknown keys, so a value that validates has none to strip: the walk
    # along the annotations, which costs 10 times the validation, is made for the others only
    # (a trace file of a gigabyte is a million lines).
    try:
        return model.model_validate(obj)
    except ValidationError:
        pass
    obj, unknown = strip_unknown_keys(model, obj)
    try:
        result = model.model_validate(obj)
    except ValidationError as exc:
        messages = validation_messages(exc, model) + unknown_key_messages(model, unknown)
        raise FormatError(path, join_messages(messages), line) from None
    if unknown:
        messages = unknown_key_messages(model, unknown)
        warnings.warn(FormatWarning(path, "; ".join(messages), line), stacklevel=2)
    return result


def parse_definition(text: str, path: PathLike = "<string>") -> Definition:
    """Parse a definition file's text."""
    return validate_obj(Definition, parse_json(text, path), path)


def parse_solution(text: str, path: PathLike = "<string>") -> Solution:
    """Parse a solution file's text."""
    return validate_obj(Solution, parse_json(text, path), path)


def parse_trace_line(
    text: str | bytes, path: PathLike = "<string>", line: int | None = None
) -> Trace:
    """Parse one JSONL line (text, or bytes as read from the file) as a trace; errors name
    ``path:line``, and a line that is not JSON at all raises NotJSONError."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise NotJSONError(path, "not UTF-8 text", line, exc.start + 1) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotJSONError(path, f"invalid JSON: {exc.msg}", line, exc.colno) from None
    return validate_obj(Trace, _refuse_lone_surrogates(obj, path, line), path, line)


def jsonl_lines(path: PathLike) -> Iterator[tuple[int, bytes]]:
    """The non-blank lines of a JSONL file with their numbers, read one at a time.

    Only a line is ever in memory, never the file: trace files grow to gigabytes. Lines end
    at ``\\n`` only (a record may hold a U+2028 that ``str.splitlines`` would cut at); each
    line keeps its end, which JSON takes as white space.
    """
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                yield lineno, line


def parse_jsonl(text: str, path: PathLike = "<string>") -> list[Trace]:
    """Parse a JSONL file of traces; blank lines are skipped."""
    traces = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            traces.append(parse_trace_line(line, path, lineno))
    return traces


def read_text(path: PathLike) -> str:
    """Read a dataset file as UTF-8, raising FormatError when it is not UTF-8."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(path, f"not UTF-8 text (byte {exc.start})") from None


def load_definition(path: PathLike) -> Definition:
    """Load a definition JSON file."""
    return parse_definition(read_text(path), path)


def load_solution(path: PathLike) -> Solution:
    """Load a solution JSON file."""
    return parse_solution(read_text(path), path)


def load_jsonl(path: PathLike) -> list[Trace]:
    """Load a JSONL file of traces (or workload lines)."""
    return parse_jsonl(read_text(path), path)
