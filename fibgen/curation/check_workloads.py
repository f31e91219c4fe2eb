"""Checks of workloads: that each fits its definition, and that the blobs its stored inputs
refer to hold the tensors, shapes and dtypes the definition gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fibgen.curation.check_files import read_lines
from fibgen.curation.findings import Report, Row
from fibgen.format.dataset import dataset_files, resolve_dataset_path
from fibgen.format.models import Definition, workload_problems


def check_workload_files(
    report: Report, definitions: dict[str, tuple[Path, Definition]]
) -> set[Path]:
    blobs: set[Path] = set()
    seen: set[tuple[str, str]] = set()
    headers: dict[Path, Any] = {}
    # definition -> (inputs whose blob is absent, workloads they are in, the first one)
    absent: dict[str, list] = {}
    for path in dataset_files(report.root, "workloads"):
        report.files["workloads"] += 1
        for lineno, trace in read_lines(report, path, "workloads"):
            name = trace.definition
            if not trace.is_workload_trace:
                report.add_line(
                    "error",
                    path,
                    lineno,
                    "an evaluated trace in workloads/ (flashinfer-bench refuses it): results "
                    "go under traces/",
                    name,
                )
                continue
            report.rows.setdefault(name, Row()).workloads += 1
            workload = trace.workload
            if (name, workload.uuid) in seen:
                report.add_line(
                    "warning", path, lineno, f"workload uuid {workload.uuid} repeats", name
                )
            seen.add((name, workload.uuid))
            found = definitions.get(name)
            if found is None:
                report.add_line(
                    "error",
                    path,
                    lineno,
                    f"a workload of {name!r}, which the dataset does not have",
                    name,
                )
                continue
            defn = found[1]
            for problem in workload_problems(defn, workload):
                report.add_line("error", path, lineno, problem, name)
            for input_name, spec in workload.inputs.items():
                if spec.type != "safetensors":
                    continue
                blob_problem = _blob_problem(report.root, spec, defn, workload, input_name, headers)
                try:
                    blobs.add(resolve_dataset_path(report.root, spec.path).resolve())
                except ValueError:
                    pass
                if blob_problem == _ABSENT:
                    entry = absent.get(name)
                    if entry is None:
                        entry = absent[name] = [0, set(), f"{path}:{lineno}: {spec.path}"]
                    entry[0] += 1
                    entry[1].add(workload.uuid)
                elif blob_problem:
                    report.add_line(
                        "error", path, lineno, f"input {input_name!r}: {blob_problem}", name
                    )
    for name, (inputs, uuids, first) in sorted(absent.items()):
        report.add(
            "error",
            first,
            f"{inputs} safetensors input(s) of {len(uuids)} workload(s) of {name} refer to "
            "blob files that are not in the dataset (the first is shown; copy the dataset's "
            "blob/ folder in)",
            name,
        )
    report.files["blobs"] = len(blobs)
    return blobs


_ABSENT = "absent"


def _blob_problem(
    root: Path,
    spec: Any,
    defn: Definition,
    workload: Any,
    input_name: str,
    headers: dict[Path, Any],
) -> str | None:
    try:
        path = resolve_dataset_path(root, spec.path)
    except ValueError as exc:
        return str(exc)
    if not path.is_file():
        return _ABSENT
    header = headers.get(path)
    if header is None:
        header = headers[path] = _header(path)
    if isinstance(header, str):
        return f"its blob {spec.path} is not a readable safetensors file: {header}"
    if spec.tensor_key not in header:
        return f"no tensor {spec.tensor_key!r} in {spec.path} (it has: {', '.join(sorted(header))})"
    dtype, shape = header[spec.tensor_key]
    tensor = defn.inputs.get(input_name)
    if tensor is None or tensor.shape is None:
        return None
    sizes = {**defn.const_axes, **workload.axes}
    if all(a in sizes for a in tensor.shape) and tensor.dtype != "float4_e2m1":
        expected = [sizes[a] for a in tensor.shape]
        if list(shape) != expected:
            return f"the stored tensor has shape {list(shape)}, the workload's axes give {expected}"
    names = {
        "float32": "F32",
        "float16": "F16",
        "bfloat16": "BF16",
        "float8_e4m3fn": "F8_E4M3",
        "float8_e5m2": "F8_E5M2",
        "int64": "I64",
        "int32": "I32",
        "int16": "I16",
        "int8": "I8",
        "bool": "BOOL",
    }
    if tensor.dtype in names and dtype != names[tensor.dtype]:
        return f"the stored tensor is {dtype}, the definition declares {tensor.dtype}"
    return None


def _header(path: Path) -> dict[str, tuple[str, list[int]]] | str:
    # The JSON header of a safetensors file: 8 bytes of length, then the header itself.
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if size <= 0 or size > 100 << 20:
                return "bad header length"
            header = json.loads(f.read(size))
    except (OSError, ValueError) as exc:
        return str(exc)
    return {
        k: (v.get("dtype", "?"), list(v.get("shape", [])))
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict)
    }


def unused_blobs(report: Report, used: set[Path]) -> None:
    base = report.root / "blob"
    if not base.is_dir():
        return
    unused = [
        p
        for p in sorted(base.rglob("*.safetensors"))
        if not p.name.startswith(".") and p.resolve() not in used
    ]
    if unused:
        shown = ", ".join(str(p.relative_to(report.root)) for p in unused[:3])
        more = f", ... ({len(unused) - 3} more)" if len(unused) > 3 else ""
        report.add(
            "warning", base, f"{len(unused)} blob file(s) no workload refers to: {shown}{more}"
        )
