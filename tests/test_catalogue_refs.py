"""Our references agree with the dataset's, and our definitions match its contracts.

For every dataset definition, the dataset's reference and ours run on the same inputs, made
by ``fibgen.runtime.inputs.make`` from the definition's ``gen`` hints at the default (small) var-axis
values on the CPU, and their outputs are compared with per-dtype tolerances (the family's
``tolerance(...)`` where it declares one). Sampling draws from torch's global generator, so it
is seeded identically before each call and the tokens must match exactly. The dataset's
reference code is read from its JSON here, at test time, and called by keyword: some take
their inputs in another order than the definition lists them.
"""

from __future__ import annotations

import ast
import functools
import gc
import json
import math
import os
from pathlib import Path

import pytest

from _shared import DATASET_DIR, catalogue_module, require_shared

# Slow as a whole: every reference of the catalogue run beside the dataset's.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CATALOGUE = sorted((ROOT / "definitions").glob("*.fidef"))
# Inputs plus the dataset reference's float32 working copies (see _nbytes); above this a CPU
# run takes too long and too much memory for CI. It admits the MoE definitions of hidden size
# 2048 and skips the DeepSeek, Kimi and Llama 4 ones (tens of GiB once expanded to float32).
# On a GPU machine the MoE instances too large for the CPU are checked too:
#   FIBGEN_REFS_DEVICE=cuda FIBGEN_REFS_MAX_GIB=120 pytest tests/test_catalogue_refs.py
MAX_BYTES = int(float(os.environ.get("FIBGEN_REFS_MAX_GIB", "3.5")) * 2**30)
DEVICE = os.environ.get("FIBGEN_REFS_DEVICE", "cpu")
SEED = 0

DATASET_PATHS = sorted((DATASET_DIR / "definitions").glob("*/*.json"))


@functools.cache
def _catalogue():
    module = catalogue_module()
    families = {f.name: f for f in module.families()}
    return {d.name: (d, families[d.family]) for d in module.definitions}


@pytest.fixture(scope="module")
def catalogue():
    return _catalogue()


@pytest.fixture(scope="module")
def dataset():
    root = require_shared("flashinfer-trace", "definitions")
    return {p.stem: json.loads(p.read_text()) for p in sorted(root.glob("*/*.json"))}


def _contract(d: dict) -> tuple:
    return (
        d["name"],
        d["op_type"],
        [(k, a["type"], a.get("value")) for k, a in d["axes"].items()],
        list(d.get("constraints", [])),
        [(k, t["shape"], t["dtype"]) for k, t in d["inputs"].items()],
        [(k, t["shape"], t["dtype"]) for k, t in d["outputs"].items()],
        list(d["tags"]),
    )


def _ours_as_json(defn) -> dict:
    def tensors(ts):
        return {
            t.name: {"shape": None if t.shape is None else list(t.shape), "dtype": t.dtype}
            for t in ts
        }

    return {
        "name": defn.name,
        "op_type": defn.op_type,
        "axes": {
            a.name: {"type": a.kind, **({"value": a.value} if a.kind == "const" else {})}
            for a in defn.axes
        },
        "constraints": list(defn.constraints),
        "inputs": tensors(defn.inputs),
        "outputs": tensors(defn.outputs),
        "tags": list(defn.tags),
    }


def _run(source: str, inputs: dict):
    import torch

    namespace: dict = {}
    exec(compile(source, "<reference>", "exec"), namespace)
    torch.manual_seed(SEED)  # sampling references draw from the global generator
    out = namespace["run"](**inputs)
    return out if isinstance(out, tuple) else (out,)


def _nbytes(spec) -> int:
    """Inputs plus the float32 copies a reference may make of them, at default var axes.

    The MoE references convert every low-precision weight to float32, and a block-scaled one
    (an input with a ``<name>_scale`` companion) is also multiplied out into a second copy.
    """
    from fibgen.runtime.inputs.make import DEFAULT_VAR_AXIS, estimate_nbytes

    sizes = {n: v for n, k, v in spec.axes if k == "const"}
    names = {i[0] for i in spec.inputs}
    total = estimate_nbytes(spec, {})
    for name, dtype, shape, _, _ in spec.inputs:
        if shape is None or not dtype.startswith(("float", "bfloat")) or dtype == "float32":
            continue
        copies = 2 if f"{name}_scale" in names else 1
        total += copies * 4 * math.prod(sizes.get(d, DEFAULT_VAR_AXIS) for d in shape)
    return total


def test_every_dataset_definition_has_a_catalogue_instance(catalogue, dataset):
    missing = sorted(set(dataset) - set(catalogue))
    assert not missing, f"dataset definitions without a catalogue instance: {missing}"


def test_contracts_match_the_dataset(catalogue, dataset):
    for name, d in dataset.items():
        assert _contract(_ours_as_json(catalogue[name][0])) == _contract(d), name


# Named constants of the dataset's references that are how its code works, not what it
# computes, with why ours need not have them.
IMPLEMENTATION_CONSTANTS = {
    "CHUNK_Q": "the dataset's reference walks the queries in chunks of this size; ours does not",
    "CHUNK": "likewise, in the references that call it CHUNK",
}
# Constants of the dataset's references that restate a const axis or parameter of the
# definition (its MoE references check shapes against them): compared with our values.
DEFINITION_CONSTANTS = {
    "E": ("num_experts", "num_local_experts"),
    "H": ("hidden_size",),
    "I": ("intermediate_size",),
    "TOP_K": ("top_k", "num_experts_per_tok"),
    "N_GROUP": ("n_group",),
    "TOPK_GROUP": ("topk_group",),
}


def _constants(source: str) -> dict[str, object]:
    """UPPER_CASE names bound to a number anywhere in a reference (EPS = 1e-5, BLOCK = 128)."""
    found: dict[str, object] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id.isupper():
                try:
                    value = ast.literal_eval(node.value)
                except ValueError:
                    continue
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    found[target.id] = value
    return found


def test_reference_constants_are_the_datasets(catalogue, dataset):
    # Outputs agreeing within a bf16 tolerance can hide a different epsilon (1e-6 for 1e-5):
    # every constant the dataset's reference names has the same value in ours, or is the
    # value of the axis or parameter of our definition it restates.
    problems = []
    checked = 0
    for name, doc in dataset.items():
        theirs = _constants(doc["reference"])
        definition = catalogue[name][0]
        ours = _constants(definition.reference)
        values = dict(definition.consts) | dict(definition.param_values)
        for constant, value in theirs.items():
            if constant in IMPLEMENTATION_CONSTANTS:
                continue
            checked += 1
            if constant in ours:
                same = ours[constant] == value
            else:
                named = [values[n] for n in DEFINITION_CONSTANTS.get(constant, ()) if n in values]
                same = value in named
            if not same:
                problems.append(
                    f"{name}: {constant} = {value!r} in the dataset's reference, "
                    f"{ours.get(constant)!r} in ours"
                )
    assert not problems, "\n".join(problems)
    assert checked >= 15  # the norms' EPS at least


def test_constants_check_catches_a_different_epsilon():
    theirs = _constants("def run(x):\n    EPS = 1e-5\n    return x + EPS\n")
    ours = _constants("EPS = 1e-06\nimport torch\ndef run(x):\n    return x + EPS\n")
    assert theirs == {"EPS": 1e-5} and ours == {"EPS": 1e-6} and theirs != ours


def _by_dataset_reference(paths: list[Path]) -> list[tuple[Path, ...]]:
    """The dataset's definitions grouped by their reference code (its 32 GEMMs share one)."""
    groups: dict[str, list[Path]] = {}
    for path in paths:
        groups.setdefault(json.loads(path.read_text())["reference"], []).append(path)
    return [tuple(group) for group in groups.values()]


REFERENCE_GROUPS = _by_dataset_reference(DATASET_PATHS)


def _group_id(group: tuple[Path, ...]) -> str:
    return group[0].stem + (f"+{len(group) - 1}" if len(group) > 1 else "")


def test_the_reference_groups_hold_every_dataset_definition_once():
    grouped = sorted(p for group in REFERENCE_GROUPS for p in group)
    assert grouped == DATASET_PATHS
    if DATASET_PATHS:
        assert len(REFERENCE_GROUPS) < len(DATASET_PATHS)  # the GEMMs are one group


# Note [one comparison per pair of references]
# Definitions whose dataset reference and ours are both the same code (the dataset's GEMMs:
# `A @ B.T` at 32 shapes, from 4096 x 1024 to 57344 x 8192) differ only in the sizes they run
# at, which the contract test above compares. Each such pair is compared once, at its
# instance of the smallest inputs: running all 32 at model shapes cost 35 s of CI for the
# same two lines of code. A definition whose reference differs is its own comparison.


@pytest.mark.parametrize(
    "group",
    REFERENCE_GROUPS or [None],
    ids=[_group_id(g) for g in REFERENCE_GROUPS] or ["dataset"],
)
def test_reference_agrees_with_the_dataset(group, catalogue):
    """Note [one comparison per pair of references]."""
    from fibgen.runtime.inputs.make import InputSpec

    if group is None:
        require_shared("flashinfer-trace", "definitions")
    pairs: dict[str, list[tuple[int, dict, object, object, object]]] = {}
    for path in group:
        d = json.loads(path.read_text())
        defn, family = catalogue[d["name"]]
        spec = InputSpec.from_ir(defn, family)
        pairs.setdefault(defn.reference, []).append((_nbytes(spec), d, defn, family, spec))
    too_big = []
    for members in pairs.values():
        size, d, defn, family, spec = min(members, key=lambda m: (m[0], m[1]["name"]))
        if size > MAX_BYTES:
            too_big.append(
                f"{defn.name}: inputs and float32 working copies of about "
                f"{size / 2**30:.1f} GiB exceed the {DEVICE} budget of "
                f"{MAX_BYTES / 2**30:.1f} GiB"
            )
            continue
        _compare_references(d, defn, family, spec)
    if too_big:
        pytest.skip(
            "; ".join(too_big) + " (FIBGEN_REFS_DEVICE and FIBGEN_REFS_MAX_GIB run it on a GPU)"
        )


def _compare_references(d: dict, defn, family, spec) -> None:
    from fibgen.runtime.checking.compare import compare
    from fibgen.runtime.inputs.make import generate_inputs

    tol = family.tolerance
    given = {}
    if tol is not None:
        given = {k: getattr(tol, k) for k in ("atol", "rtol", "matched")}
        given = {k: v for k, v in given.items() if v is not None}
    inputs = generate_inputs(spec, {}, device=DEVICE, seed=SEED)
    expected = _on_cpu(_run(d["reference"], inputs))
    actual = _on_cpu(_run(defn.reference, inputs))
    del inputs
    assert len(actual) == len(expected) == len(d["outputs"])
    failures = []
    for out_name, a, e in zip(d["outputs"], actual, expected):
        result = compare(a, e, **given)
        if not result.ok:
            failures.append(f"{out_name}: {result}")
    del actual, expected
    gc.collect()  # the next definition may need the memory these held
    assert not failures, f"{defn.name}: " + "\n".join(failures)


def _on_cpu(outputs: tuple) -> tuple:
    return tuple(o.cpu() if hasattr(o, "cpu") else o for o in outputs)


def _extra(name: str):
    from fibgen.runtime.inputs.make import InputSpec, generate_inputs

    defn, family = _catalogue()[name]
    namespace: dict = {}
    exec(defn.reference, namespace)
    return namespace["run"], generate_inputs(InputSpec.from_ir(defn, family), {})


def test_merge_state_of_two_halves_is_attention_over_all_keys():
    import torch

    run, _ = _extra("merge_state_h16_d128")
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 16, 128, generator=gen)
    k, v = torch.randn(10, 16, 128, generator=gen), torch.randn(10, 16, 128, generator=gen)

    def attend(keys, values):
        logits = torch.einsum("qhd,khd->qhk", q, keys) / math.sqrt(128)
        out = torch.einsum("qhk,khd->qhd", logits.softmax(-1), values)
        return out, torch.logsumexp(logits, -1) / math.log(2)

    (o1, s1), (o2, s2), (o, s) = attend(k[:4], v[:4]), attend(k[4:], v[4:]), attend(k, v)
    merged, lse = run(o1, s1, o2, s2)
    assert torch.allclose(merged, o, atol=1e-5) and torch.allclose(lse, s, atol=1e-5)


def test_append_paged_kv_cache_writes_each_token_to_its_slot():
    run, x = _extra("append_paged_kv_cache_kv8_d128_ps16")
    k_out, v_out = run(**x)
    indptr, indices = x["kv_indptr"].long(), x["kv_indices"].long()
    written = set()
    for i in reversed(range(x["append_key"].shape[0])):  # the last write to a slot wins
        b, pos = int(x["batch_indices"][i]), int(x["positions"][i])
        page, slot = int(indices[indptr[b] + pos // 16]), pos % 16
        if (page, slot) in written:
            continue
        written.add((page, slot))
        assert bool((k_out[page, slot] == x["append_key"][i]).all())
        assert bool((v_out[page, slot] == x["append_value"][i]).all())
    untouched = [(p, s) for p in range(k_out.shape[0]) for s in range(16) if (p, s) not in written]
    for p, s in untouched:
        assert bool((k_out[p, s] == x["k_cache"][p, s]).all())
