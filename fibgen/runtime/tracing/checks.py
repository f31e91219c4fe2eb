"""Whether a traced call is a workload of its definition: the definition's contract, and
the check of a call's inputs against it.

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
"""

from __future__ import annotations

import collections
import glob
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from fibgen.runtime.routing.api import Api


def definition_file(api: Api, name: str) -> Path | None:
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


def contract(
    definition: Mapping[str, Any], part: str = "inputs"
) -> tuple[list[tuple[str, str | None, tuple[str, ...]]], dict[str, int]]:
    """(name, dtype, shape) of each tensor input (or output, ``part="outputs"``) of a
    definition JSON, in its order, and the values of its const axes."""
    tensors = [
        (n, t.get("dtype"), tuple(t["shape"]))
        for n, t in definition[part].items()
        if t.get("shape") is not None
    ]
    consts = {
        a: int(spec["value"])
        for a, spec in definition.get("axes", {}).items()
        if spec.get("type") == "const" and spec.get("value") is not None
    }
    return tensors, consts


def _contract(
    api: Api, source: Path | None
) -> tuple[list[tuple[str, str | None, tuple[str, ...]]], dict[str, int]]:
    """(name, dtype, shape) of each tensor input in ``api.inputs`` order, and the const axes'
    values: from the definition JSON when there is one, else the dispatcher's table."""
    if source is not None:
        try:
            data = json.loads(source.read_text(encoding="utf-8"))
            if list(data["inputs"]) == list(api.inputs):
                return contract(data)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # the dispatcher's table still checks dtypes and ranks
    tensors = [
        (n, api.tensors[n][0], tuple(api.tensors[n][1])) for n in api.inputs if n in api.tensors
    ]
    return tensors, {}


def input_check(api: Api, source: Path | None) -> Callable[[Sequence[Any]], str | None]:
    """The check of a call's input values against the definition (Note [checked records]):
    the reason of the first mismatch, or None."""
    return mismatch_of(tuple(api.inputs), *_contract(api, source))


def mismatch_of(
    inputs: tuple[str, ...],
    tensors: list[tuple[str, str | None, tuple[str, ...]]],
    consts: Mapping[str, int],
) -> Callable[[Sequence[Any]], str | None]:
    """The check of a record's input values (in ``inputs`` order) against a contract: why
    the first input that differs does, or None."""
    check = checker(inputs, tensors, consts)

    def reason(values: Sequence[Any]) -> str | None:
        failed = check(values)
        return None if failed is None else failed[1]

    return reason


# Note [written-out checks]
# A check runs on every call that tracing records or hand-written ``apply`` routes, so it is
# written out once per definition as a Python function of its own, with each input's index,
# rank and const sizes as literals: no loop over a plan, no tuples unpacked per call. Only
# integers (indices, ranks, dims, sizes) go into its source; dtypes and the readers are names
# of its namespace. It reads shapes and dtypes with the hit path's readers (Note [native
# reads] in fibgen/runtime/checking/result_check.py), looked up per call so that it uses the
# native ones once they are built. A call that fails is said by ``_mismatch``, which works
# the reason out again, slowly, from the contract. On the 2-core CPU a check of
# ``rmsnorm_h4096``'s two inputs went from 0.66 to 0.26 µs.


# What a one-byte float input (fp8, packed fp4, e8m0 scales) may come as besides its own
# dtype, where bytes are accepted: FlashInfer's callers pass such tensors as uint8 as often as
# not.
BYTES = (torch.uint8, torch.int8)


def one_byte_float(dtype: str | None) -> bool:
    """Whether a definition's dtype is a one-byte (or packed half-byte) float."""
    return dtype is not None and dtype.startswith(("float8", "float4"))


def checker(
    inputs: tuple[str, ...],
    tensors: list[tuple[str, str | None, tuple[str, ...]]],
    consts: Mapping[str, int],
    *,
    bytes_for_floats: bool = False,
    outputs: frozenset[str] = frozenset(),
) -> Callable[[Sequence[Any]], tuple[str, str] | None]:
    """The check of input values (in ``inputs`` order) against a contract (``contract``):
    the first input that differs and why, or None (Note [written-out checks]).
    ``bytes_for_floats``: a one-byte float input may also come as ``BYTES``. ``outputs``: the
    names among ``inputs`` that are a destination-passing call's output buffers, checked as
    inputs are, never None, and named as outputs."""
    from fibgen.runtime.checking import result_check
    from fibgen.runtime.inputs.make import torch_dtype

    index = {n: i for i, n in enumerate(inputs)}
    wants: dict[str, torch.dtype | tuple[torch.dtype, ...] | None] = {}
    for name, dtype, _ in tensors:
        own: torch.dtype | None = None
        try:
            own = torch_dtype(dtype) if dtype is not None else None
        except ValueError:  # a dtype this torch lacks: left unchecked, or bytes
            pass
        if bytes_for_floats and one_byte_float(dtype):
            wants[name] = BYTES if own is None else (own, *BYTES)
        else:
            wants[name] = own
    # A var axis is checked only where two dims carry it: alone, any size is its value.
    uses = collections.Counter(axis for _, _, shape in tensors for axis in shape)
    shared_axes = sorted(a for a, n in uses.items() if n > 1 and a not in consts)
    slots = {a: k for k, a in enumerate(shared_axes)}

    def why(values: Sequence[Any]) -> tuple[str, str]:
        return _mismatch(tensors, wants, consts, index, values, outputs)

    namespace: dict[str, Any] = {"_reads": result_check.LIVE, "_Tensor": torch.Tensor}
    namespace["_why"] = why
    lines = [
        "def check(values):",
        "    shape_of = _reads['shape_of']",
        "    dtype_of = _reads['dtype_of']",
    ]
    lines += [f"    a{k} = None" for k in slots.values()]
    for j, (name, _, shape) in enumerate(tensors):
        failed = []
        if isinstance(wants[name], tuple):
            namespace[f"_w{j}"] = wants[name]
            failed.append(f"dtype_of(v) not in _w{j}")
        elif wants[name] is not None:
            namespace[f"_w{j}"] = wants[name]
            failed.append(f"dtype_of(v) is not _w{j}")
        failed.append(f"len(s) != {len(shape)}")
        failed += [f"s[{d}] != {int(consts[a])}" for d, a in enumerate(shape) if a in consts]
        lines.append(f"    v = values[{index[name]}]")
        if name in outputs:  # a buffer to write into: never left out
            lines += ["    if v is None:", "        return _why(values)"]
        lines += [
            "    if v is not None:  # None: an optional input left out",
            "        if not isinstance(v, _Tensor):",
            "            return _why(values)",
            "        s = shape_of(v)",
            f"        if {' or '.join(failed)}:",
            "            return _why(values)",
        ]
        for d, axis in enumerate(shape):
            if axis in slots:
                k = slots[axis]
                lines += [
                    f"        if a{k} is None:",
                    f"            a{k} = s[{d}]",
                    f"        elif s[{d}] != a{k}:",
                    "            return _why(values)",
                ]
    lines.append("    return None")
    exec(compile("\n".join(lines), "<fibgen input check>", "exec"), namespace)
    check: Callable[[Sequence[Any]], tuple[str, str] | None] = namespace["check"]
    return check


def _mismatch(
    tensors: list[tuple[str, str | None, tuple[str, ...]]],
    wants: Mapping[str, torch.dtype | tuple[torch.dtype, ...] | None],
    consts: Mapping[str, int],
    index: Mapping[str, int],
    values: Sequence[Any],
    outputs: frozenset[str] = frozenset(),
) -> tuple[str, str]:
    """The first input (or output buffer) of a call that is not the definition's, and why,
    said as the launchers say it."""
    seen: dict[str, tuple[int, str, int]] = {}
    for name, dtype, shape in tensors:
        value = values[index[name]]
        if value is None and name in outputs:
            return name, f"output {name} is None, not a buffer to write into"
        if value is None:
            continue
        kind = "output" if name in outputs else "input"
        if not isinstance(value, torch.Tensor):
            return name, f"{kind} {name} is a {type(value).__name__}, not a tensor"
        want = wants[name]
        if isinstance(want, tuple) and value.dtype not in want:
            got = str(value.dtype).removeprefix("torch.")
            return name, (
                f"{kind} {name} is {got}, the definition's is {dtype} (or its bytes as uint8 "
                "or int8)"
            )
        if isinstance(want, torch.dtype) and value.dtype is not want:
            got = str(value.dtype).removeprefix("torch.")
            return name, f"{kind} {name} is {got}, the definition's is {dtype}"
        if value.ndim != len(shape):
            return name, (
                f"{kind} {name} has {value.ndim} dims, the definition's has {len(shape)} "
                f"[{', '.join(shape)}]"
            )
        for d, axis in enumerate(shape):
            size = int(value.shape[d])
            if axis in consts and size != consts[axis]:
                return name, (
                    f"{kind} {name} has size {size} along axis {axis} (dim {d}), the "
                    f"definition's is {consts[axis]}"
                )
            first = seen.setdefault(axis, (size, name, d))
            if first[0] != size:
                return name, (
                    f"{kind} {name} has size {size} along axis {axis} (dim {d}), expected "
                    f"{first[0]} as in {first[1]} (dim {first[2]})"
                )
    return "", "its inputs differ from the definition's"  # not reached: check() found one
