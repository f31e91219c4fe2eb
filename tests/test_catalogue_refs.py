"""Our attention references agree with the dataset's, and our definitions match its contracts.

For every dataset definition that an ``definitions/attention_*.fidef`` family produces, both
references run on the same generated inputs (small var axes, CPU) and their outputs are
compared with per-dtype tolerances. The dataset's reference code is read from its JSON here,
at test time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _shared import require_shared

ROOT = Path(__file__).resolve().parents[1]
CATALOGUE = sorted((ROOT / "definitions").glob("attention_*.fidef"))
MAX_INPUT_BYTES = 1 << 30  # above this a CPU run is too slow and too large for CI


def _compiled():
    from fibgen.compiler import compile_paths

    result = compile_paths([str(p) for p in CATALOGUE])
    if not result.ok:
        messages = "\n".join(str(d) for d in result.diagnostics)
        pytest.fail(f"the attention catalogue does not compile:\n{messages}")
    families = {f.name: f for f in result.module.families()}
    return {d.name: (d, families[d.family]) for d in result.module.definitions}


@pytest.fixture(scope="module")
def catalogue():
    return _compiled()


@pytest.fixture(scope="module")
def dataset(catalogue):
    root = require_shared("flashinfer-trace", "definitions")
    found = {}
    for path in sorted(root.glob("*/*.json")):
        d = json.loads(path.read_text())
        if d["name"] in catalogue:
            found[d["name"]] = d
    return found


def _contract(d: dict) -> tuple:
    return (
        d["name"],
        d["op_type"],
        [(k, a["type"], a.get("value")) for k, a in d["axes"].items()],
        list(d["constraints"]),
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
    namespace: dict = {}
    exec(compile(source, "<reference>", "exec"), namespace)
    out = namespace["run"](**inputs)
    return out if isinstance(out, tuple) else (out,)


def test_every_attention_family_of_the_dataset_is_covered(catalogue, dataset):
    root = require_shared("flashinfer-trace", "definitions")
    families = ("gqa_paged", "gqa_ragged", "mla_paged", "mla_ragged", "dsa_paged")
    wanted = {p.stem for fam in families for p in (root / fam).glob("*.json")}
    missing = sorted(wanted - set(dataset))
    assert not missing, f"dataset definitions without a catalogue instance: {missing}"


def test_contracts_match_the_dataset(catalogue, dataset):
    for name, d in dataset.items():
        assert _contract(_ours_as_json(catalogue[name][0])) == _contract(d), name


def test_references_agree_with_the_dataset(catalogue, dataset):
    import torch

    from fibgen.runtime.compare import compare
    from fibgen.runtime.inputs import InputSpec, estimate_nbytes, generate_inputs

    skipped, failures = [], []
    for name, d in sorted(dataset.items()):
        defn, family = catalogue[name]
        spec = InputSpec.from_ir(defn, family)
        size = estimate_nbytes(spec, {})
        if size > MAX_INPUT_BYTES:
            skipped.append(f"{name} (inputs of about {size / 2**30:.1f} GiB)")
            continue
        torch.manual_seed(0)
        inputs = generate_inputs(spec, {}, seed=0)
        expected = _run(d["reference"], inputs)
        actual = _run(defn.reference, inputs)
        for out_name, a, e in zip(d["outputs"], actual, expected):
            result = compare(a, e)
            if not result.ok:
                failures.append(f"{name}.{out_name}: {result}")
    assert not failures, "\n".join(failures)
    if skipped:
        pytest.skip("compared all but: " + ", ".join(skipped))


def _extra(name: str):
    from fibgen.runtime.inputs import InputSpec, generate_inputs

    defn, family = _compiled()[name]
    namespace: dict = {}
    exec(defn.reference, namespace)
    return namespace["run"], generate_inputs(InputSpec.from_ir(defn, family), {})


def test_merge_state_of_two_halves_is_attention_over_all_keys():
    import math

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
