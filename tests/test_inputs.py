"""Input generation: dtypes, shapes, hints, derived axes and constraint checks."""

import pytest
import torch

from fibgen.format.hints import HINT_SIGNATURES, HintError, bind_hint
from fibgen.runtime.inputs.make import (
    InputGenerationError,
    InputSpec,
    estimate_nbytes,
    generate_inputs,
    generate_inputs_with_axes,
    parse_hint,
)


def paged_decode_spec(with_last_page_len: bool = True) -> InputSpec:
    inputs = [
        ("q", "bfloat16", ("batch_size", "num_qo_heads", "head_dim"), False, None),
        (
            "k_cache",
            "bfloat16",
            ("num_pages", "page_size", "num_kv_heads", "head_dim"),
            False,
            None,
        ),
        ("kv_indptr", "int32", ("len_indptr",), False, "indptr(over=kv_indices)"),
        (
            "kv_indices",
            "int32",
            ("num_kv_indices",),
            False,
            "indices(below=num_pages, unique=True)",
        ),
    ]
    if with_last_page_len:
        inputs.append(
            (
                "kv_last_page_len",
                "int32",
                ("batch_size",),
                False,
                "last_page_len(kv_indptr, page_size)",
            )
        )
    inputs.append(("sm_scale", "float32", None, False, "value(1 / sqrt(head_dim))"))
    return InputSpec(
        name="decode",
        axes=(
            ("batch_size", "var", None),
            ("num_qo_heads", "const", 4),
            ("num_kv_heads", "const", 2),
            ("head_dim", "const", 16),
            ("num_pages", "var", None),
            ("page_size", "const", 8),
            ("len_indptr", "var", None),
            ("num_kv_indices", "var", None),
        ),
        inputs=tuple(inputs),
        constraints=("len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()"),
    )


def prefill_spec() -> InputSpec:
    return InputSpec(
        name="prefill",
        axes=(
            ("num_heads", "const", 2),
            ("page_size", "const", 4),
            ("len_indptr", "var", None),
            ("total_q", "var", None),
            ("num_kv_indices", "var", None),
            ("num_pages", "var", None),
            ("batch_size", "var", None),
        ),
        inputs=(
            ("q", "float16", ("total_q", "num_heads"), False, None),
            ("k_cache", "float16", ("num_pages", "page_size", "num_heads"), False, None),
            ("qo_indptr", "int32", ("len_indptr",), False, "indptr(over=q)"),
            (
                "kv_indptr",
                "int32",
                ("len_indptr",),
                False,
                "indptr(over=kv_indices, at_least=qo_indptr, unit=page_size)",
            ),
            ("kv_indices", "int32", ("num_kv_indices",), False, "indices(below=num_pages)"),
            (
                "kv_last_page_len",
                "int32",
                ("batch_size",),
                False,
                "last_page_len(kv_indptr, page_size, at_least=qo_indptr)",
            ),
        ),
        constraints=("total_q == qo_indptr[-1].item()", "num_kv_indices == kv_indptr[-1].item()"),
    )


def test_paged_decode_defaults_are_consistent():
    spec = paged_decode_spec()
    x, axes = generate_inputs_with_axes(spec, {})
    assert axes["len_indptr"] == axes["batch_size"] + 1
    assert x["q"].shape == (axes["batch_size"], 4, 16) and x["q"].dtype == torch.bfloat16
    indptr = x["kv_indptr"]
    assert indptr.dtype == torch.int32 and indptr[0] == 0 and bool((indptr.diff() >= 1).all())
    assert indptr[-1] == x["kv_indices"].numel() == axes["num_kv_indices"]
    assert x["kv_indices"].unique().numel() == x["kv_indices"].numel()
    assert int(x["kv_indices"].max()) < axes["num_pages"]
    assert bool(((x["kv_last_page_len"] >= 1) & (x["kv_last_page_len"] <= 8)).all())
    assert isinstance(x["sm_scale"], float) and abs(x["sm_scale"] - 0.25) < 1e-12


def test_given_axes_are_used_and_derived_from_constraints():
    spec = paged_decode_spec(with_last_page_len=False)
    _, axes = generate_inputs_with_axes(spec, {"batch_size": 7})
    assert axes["len_indptr"] == 8
    _, axes = generate_inputs_with_axes(spec, {"len_indptr": 3})
    assert axes["batch_size"] == 2  # solved from `len_indptr == batch_size + 1`
    x, axes = generate_inputs_with_axes(spec, {"batch_size": 2, "num_kv_indices": 11})
    assert int(x["kv_indptr"][-1]) == 11 and x["kv_indices"].shape == (11,)


def test_same_seed_same_inputs_other_seed_differs():
    spec = paged_decode_spec()
    a, b = generate_inputs(spec, {}, seed=3), generate_inputs(spec, {}, seed=3)
    for k in a:
        assert torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
    c = generate_inputs(spec, {"batch_size": a["q"].shape[0]}, seed=4)
    assert not torch.equal(a["q"], c["q"])


def test_causal_prefill_has_enough_kv_per_sequence():
    spec = prefill_spec()
    for seed in range(5):
        x, axes = generate_inputs_with_axes(spec, {}, seed=seed)
        q_len = x["qo_indptr"].diff()
        pages = x["kv_indptr"].diff()
        kv_len = (pages - 1) * 4 + x["kv_last_page_len"]
        assert bool((kv_len >= q_len).all())
        assert axes["batch_size"] == axes["len_indptr"] - 1
        assert axes["total_q"] == int(x["qo_indptr"][-1])


def test_ragged_pair_and_given_total():
    spec = InputSpec(
        name="ragged",
        axes=(("len_indptr", "var", None), ("total_q", "var", None), ("total_kv", "var", None)),
        inputs=(
            ("q", "float32", ("total_q",), False, None),
            ("k", "float32", ("total_kv",), False, None),
            ("qo_indptr", "int32", ("len_indptr",), False, "indptr(over=q)"),
            ("kv_indptr", "int64", ("len_indptr",), False, "indptr(over=k, at_least=qo_indptr)"),
        ),
        constraints=("total_q == qo_indptr[-1].item()", "total_kv == kv_indptr[-1].item()"),
    )
    x = generate_inputs(spec, {"len_indptr": 4, "total_q": 30})
    assert int(x["qo_indptr"][-1]) == 30 and x["q"].shape == (30,)
    assert bool((x["kv_indptr"].diff() >= x["qo_indptr"].diff()).all())
    with pytest.raises(InputGenerationError, match="cannot split total_kv = 2 rows"):
        generate_inputs(spec, {"len_indptr": 4, "total_q": 30, "total_kv": 2})


def test_violated_constraint_quotes_text_and_values():
    spec = paged_decode_spec(with_last_page_len=False)
    with pytest.raises(InputGenerationError) as err:
        generate_inputs(spec, {"batch_size": 2, "len_indptr": 5})
    msg = str(err.value)
    assert "constraint `len_indptr == batch_size + 1` does not hold" in msg
    assert "len_indptr = 5" in msg and "batch_size + 1 = 3" in msg


def test_bad_axis_arguments():
    spec = paged_decode_spec()
    with pytest.raises(InputGenerationError, match="has no axis `batch`"):
        generate_inputs(spec, {"batch": 2})
    with pytest.raises(InputGenerationError, match="const axis of value 8"):
        generate_inputs(spec, {"page_size": 16})


def test_inequality_constraint_raises_default():
    spec = InputSpec(
        name="indexer",
        axes=(
            ("batch", "var", None),
            ("topk", "const", 64),
            ("pages", "var", None),
            ("ps", "const", 8),
        ),
        inputs=(
            ("seq_lens", "int32", ("batch",), False, "range(1, pages * ps + 1)"),
            ("table", "int32", ("batch", "pages"), False, "indices(below=32, unique=True)"),
        ),
        constraints=("topk <= pages * ps",),
    )
    x, axes = generate_inputs_with_axes(spec, {})
    assert axes["pages"] == 8  # the smallest value with 64 <= pages * 8
    assert all(len(set(row)) == 8 for row in x["table"].tolist())
    assert int(x["seq_lens"].max()) <= 64 and int(x["seq_lens"].min()) >= 1


def test_dtypes_and_plain_hints():
    spec = InputSpec(
        name="dtypes",
        axes=(("n", "var", None), ("v", "const", 6)),
        inputs=(
            ("a", "float8_e4m3fn", ("n", "v"), False, None),
            ("b", "float8_e5m2", ("n",), False, "normal(0, 2)"),
            ("c", "float4_e2m1", ("n", "v"), False, None),
            ("d", "bool", ("n",), False, None),
            ("e", "int64", ("n",), False, None),
            ("p", "float32", ("n", "v"), False, "prob()"),
            ("r", "int32", ("n",), False, "range(3, 5)"),
            ("f", "bfloat16", ("n",), False, "range(-1.0, 1.0)"),
            ("z", "float16", ("n",), False, "zeros()"),
            ("o", "float32", ("n",), False, "ones()"),
            ("w", "float32", ("n",), False, "value(2.5)"),
            ("ar", "int32", ("n", "v"), False, "arange(10)"),
            ("t", "int32", (), False, "value(n * 2)"),
            ("s", "int32", None, False, "range(1, 2)"),
            ("flag", "bool", None, False, None),
            ("opt", "float32", ("n",), True, "none()"),
        ),
    )
    x = generate_inputs(spec, {"n": 5})
    assert x["a"].dtype == torch.float8_e4m3fn and x["a"].shape == (5, 6)
    assert x["b"].dtype == torch.float8_e5m2
    assert x["c"].element_size() == 1 and x["c"].shape == (5, 6)
    assert x["d"].dtype == torch.bool and x["e"].dtype == torch.int64 and int(x["e"].min()) >= 0
    assert torch.allclose(x["p"].sum(-1), torch.ones(5)) and bool((x["p"] >= 0).all())
    assert set(x["r"].tolist()) <= {3, 4}
    assert float(x["f"].float().abs().max()) <= 1.0
    assert not x["z"].any() and bool((x["o"] == 1).all()) and bool((x["w"] == 2.5).all())
    assert x["ar"].flatten().tolist() == list(range(10, 40))
    assert x["t"].shape == () and int(x["t"]) == 10
    assert x["s"] == 1 and isinstance(x["flag"], bool) and x["opt"] is None


def test_sparse_indices_and_unique_rows():
    spec = InputSpec(
        name="sparse",
        axes=(("t", "var", None), ("k", "const", 16), ("e", "const", 10)),
        inputs=(
            ("idx", "int32", ("t", "k"), False, "sparse_indices(below=12)"),
            ("experts", "int32", ("t", "k"), False, "indices(below=k * 2, unique=True)"),
            ("blocks", "int32", ("t", "k"), False, "sparse_indices(below=40, ascending=True)"),
        ),
    )
    x = generate_inputs(spec, {"t": 6})
    for row in x["idx"].tolist():
        valid = [v for v in row if v != -1]
        assert 1 <= len(valid) <= 12 and len(set(valid)) == len(valid)
        assert row[len(valid) :] == [-1] * (16 - len(valid)) and max(valid) < 12
    assert any(v != sorted(v) for v in ([r for r in row if r != -1] for row in x["idx"].tolist()))
    for row in x["blocks"].tolist():  # ascending=True: the same, sorted
        valid = [v for v in row if v != -1]
        assert valid == sorted(set(valid)) and row[len(valid) :] == [-1] * (16 - len(valid))
    for row in x["experts"].tolist():
        assert len(set(row)) == 16 and max(row) < 32


def bsr_spec(kv_heads: int) -> InputSpec:
    """A BSR matrix per request and pattern head (1 or every KV head), as block-sparse
    attention takes it: offsets absolute into one tensor of column blocks."""
    return InputSpec(
        name="bsr",
        axes=(
            ("b", "var", None),
            ("kv", "const", kv_heads),
            ("p", "var", None),
            ("rows", "var", None),
            ("nnz", "var", None),
            ("blocks", "const", 5),
        ),
        inputs=(
            ("indptr", "int32", ("b", "p", "rows"), False, "indptr(over=idx, max_len=blocks)"),
            ("idx", "int32", ("nnz",), False, "bsr_indices(indptr, blocks)"),
        ),
        constraints=("p == 1 or p == kv",),
    )


@pytest.mark.parametrize("kv_heads", [2, 24])
def test_an_n_d_indptr_chains_its_rows_and_bsr_indices_ascend_in_each_segment(kv_heads):
    x, axes = generate_inputs_with_axes(bsr_spec(kv_heads), {"b": 3, "rows": 4})
    # A constraint met only at 1 or kv (no power of two when kv is 24, below the default when
    # it is 2) still finds its value.
    assert axes["p"] == kv_heads
    indptr = x["indptr"]
    assert indptr.shape == (3, kv_heads, 4)
    flat = indptr.reshape(-1, 4)
    assert int(flat[0, 0]) == 0 and int(flat[-1, -1]) == axes["nnz"] == x["idx"].numel()
    assert torch.equal(flat[1:, 0], flat[:-1, -1])  # each row starts where the one before ends
    lengths = (flat[:, 1:] - flat[:, :-1]).flatten()
    assert int(lengths.min()) >= 1 and int(lengths.max()) <= 5
    for row in flat.tolist():
        for start, end in zip(row[:-1], row[1:]):
            seg = x["idx"][start:end].tolist()
            assert seg == sorted(set(seg)) and 0 <= min(seg) and max(seg) < 5


def test_bsr_indices_refuse_a_segment_longer_than_the_blocks():
    spec = bsr_spec(2)
    spec = InputSpec(
        name=spec.name,
        axes=spec.axes,
        inputs=(spec.inputs[0], ("idx", "int32", ("nnz",), False, "bsr_indices(indptr, 2)")),
        constraints=spec.constraints,
    )
    with pytest.raises(InputGenerationError, match="distinct blocks below 2"):
        generate_inputs_with_axes(spec, {"b": 1, "rows": 2, "p": 1, "nnz": 6})


def test_fp8_paged_with_scales_decodes_to_finite_values():
    spec = InputSpec(
        name="fp8cache",
        axes=(("p", "var", None), ("ps", "const", 4), ("h", "const", 1), ("w", "const", 20)),
        inputs=(("cache", "int8", ("p", "ps", "h", "w"), False, "fp8_paged_with_scales()"),),
    )
    cache = generate_inputs(spec, {"p": 3})["cache"]
    flat = cache.view(torch.uint8).reshape(3, 4 * 20)
    scales = flat[:, 4 * 16 :].contiguous().view(torch.float32)
    values = flat[:, : 4 * 16].contiguous().view(torch.float8_e4m3fn).float()
    assert bool(((scales > 0) & (scales < 1)).all()) and bool(values.isfinite().all())


def test_random_fp8_values_are_finite_normal_numbers_of_both_signs():
    spec = InputSpec(
        name="fp8",
        axes=(("n", "var", None), ("v", "const", 1000)),
        inputs=(
            ("a", "float8_e4m3fn", ("n", "v"), False, None),
            ("b", "float8_e5m2", ("n", "v"), False, None),
        ),
    )
    x = generate_inputs(spec, {"n": 3})
    for name in ("a", "b"):
        values = x[name].float()
        assert values.shape == (3, 1000) and bool(values.isfinite().all())
        magnitude = values.abs()
        assert bool(((magnitude >= 0.125) & (magnitude < 2)).all())
        assert 0.4 < float((values > 0).float().mean()) < 0.6
    again = generate_inputs(spec, {"n": 3})
    assert torch.equal(x["a"].view(torch.uint8), again["a"].view(torch.uint8))


def test_packed_topk_rows_name_distinct_experts_with_weights_summing_to_one():
    spec = InputSpec(
        name="routed",
        axes=(("t", "var", None), ("k", "const", 8), ("e", "const", 10)),
        inputs=(("topk_ids", "int32", ("t", "k"), False, "packed_topk(e)"),),
    )
    packed = generate_inputs(spec, {"t": 6})["topk_ids"]
    assert packed.dtype == torch.int32 and packed.shape == (6, 8)
    # Decoded the way the kernels' references do it.
    experts = (packed >> 16).to(torch.int64)
    weights = (packed & 0xFFFF).to(torch.int16).view(torch.bfloat16).float()
    for row in experts.tolist():
        assert len(set(row)) == 8 and 0 <= min(row) and max(row) < 10
    assert bool((weights > 0).all())
    assert torch.allclose(weights.sum(-1), torch.ones(6), atol=1e-2)
    too_many = InputSpec(
        name="routed",
        axes=(("t", "var", None), ("k", "const", 8)),
        inputs=(("topk_ids", "int32", ("t", "k"), False, "packed_topk(4)"),),
    )
    with pytest.raises(InputGenerationError, match="needs 8 distinct experts per row"):
        generate_inputs(too_many, {"t": 2})


def test_hint_errors():
    with pytest.raises(InputGenerationError, match="unknown generation hint `indptrs`"):
        InputSpec("x", (("n", "var", None),), (("a", "int32", ("n",), False, "indptrs(a)"),))
    with pytest.raises(InputGenerationError, match="`indices` needs `below`"):
        InputSpec("x", (("n", "var", None),), (("a", "int32", ("n",), False, "indices()"),))
    with pytest.raises(InputGenerationError, match="undeclared axis `m`"):
        InputSpec("x", (("n", "var", None),), (("a", "int32", ("m",), False, None),))
    spec = InputSpec("x", (("n", "var", None),), (("a", "int32", ("n",), False, "range(0, foo)"),))
    with pytest.raises(InputGenerationError, match="uses `foo`, which is not an axis"):
        generate_inputs(spec, {"n": 2})
    spec = InputSpec(
        "x",
        (("n", "var", None),),
        (("a", "int32", ("n",), False, "indices(below=3, unique=True)"),),
    )
    with pytest.raises(InputGenerationError, match="needs 5 distinct values per row"):
        generate_inputs(spec, {"n": 5})


def test_hint_signatures_and_binding():
    assert {
        "indptr",
        "indices",
        "value",
        "prob",
        "range",
        "normal",
        "zeros",
        "ones",
        "packed_topk",
    } <= set(HINT_SIGNATURES)
    for sig in HINT_SIGNATURES.values():
        assert sig.meaning and set(sig.required) <= set(sig.params())
    assert bind_hint("indptr", ("kv_indices",), (("max_len", "4"),)) == {
        "over": "kv_indices",
        "max_len": "4",
    }
    with pytest.raises(HintError, match="has no parameter `step`"):
        bind_hint("range", ("0", "1"), (("step", "2"),))
    with pytest.raises(HintError, match="at most 2 positional"):
        bind_hint("range", ("0", "1", "2"), ())
    assert parse_hint("indptr(over=kv_indices, min_len=2)") == (
        "indptr",
        (),
        (("over", "kv_indices"), ("min_len", "2")),
    )


def test_from_definition_json_and_size_estimate():
    d = {
        "name": "rmsnorm_h8",
        "axes": {"batch_size": {"type": "var"}, "hidden_size": {"type": "const", "value": 8}},
        "constraints": [],
        "inputs": {
            "hidden_states": {"shape": ["batch_size", "hidden_size"], "dtype": "bfloat16"},
            "weight": {"shape": ["hidden_size"], "dtype": "bfloat16"},
        },
        "outputs": {"output": {"shape": ["batch_size", "hidden_size"], "dtype": "bfloat16"}},
        "reference": "def run(hidden_states, weight): ...",
    }
    spec = InputSpec.from_definition_json(d, {"weight": "ones()"})
    x = generate_inputs(spec, {"batch_size": 3})
    assert x["hidden_states"].shape == (3, 8) and bool((x["weight"] == 1).all())
    assert estimate_nbytes(spec, {"batch_size": 3}) == (24 + 8) * 2


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_random_16_bit_fills_are_unit_normals_drawn_in_their_dtype(dtype):
    # Note [16-bit normals]: drawn in the dtype, with float32's values whenever the count is a
    # multiple of 16, and a unit normal's spread at any count.
    def spec(v: int) -> InputSpec:
        return InputSpec(
            name="half",
            axes=(("n", "var", None), ("v", "const", v)),
            inputs=(("a", dtype, ("n", "v"), False, None),),
        )

    drawn = generate_inputs(spec(1024), {"n": 3}, seed=7)["a"]
    assert drawn.dtype == getattr(torch, dtype)
    rounded = torch.randn((3, 1024), generator=torch.Generator().manual_seed(7))
    assert torch.equal(drawn, rounded.to(drawn.dtype))
    odd = generate_inputs(spec(4097), {"n": 5}, seed=7)["a"].float()
    assert bool(odd.isfinite().all())
    assert abs(float(odd.mean())) < 0.02 and abs(float(odd.std()) - 1) < 0.02
    assert torch.equal(odd, generate_inputs(spec(4097), {"n": 5}, seed=7)["a"].float())


@pytest.mark.parametrize(
    "dtype,hint",
    [
        ("bfloat16", None),
        ("float32", "normal(mean=1.0, std=0.5)"),
        ("float8_e4m3fn", None),
        ("float4_e2m1", None),
        ("int8", None),
        ("int32", "range(lo=-50, hi=50)"),
    ],
)
def test_a_large_random_fill_repeats_a_prime_period_and_no_row_repeats(dtype, hint):
    # Note [large random fills]: above TILE_ABOVE elements one drawn period is repeated.
    from fibgen.runtime.inputs.fills import TILE_ABOVE, TILE_PERIOD
    from fibgen.runtime.inputs.specs import torch_dtype

    cols = 4096
    rows = TILE_ABOVE // cols + 3  # just above the threshold, not a whole number of periods
    spec = InputSpec(
        name="big",
        axes=(("n", "var", None), ("k", "const", cols)),
        inputs=(("w", dtype, ("n", "k"), False, hint),),
    )
    w = generate_inputs(spec, {"n": rows}, seed=3)["w"]
    assert w.shape == (rows, cols) and w.dtype == torch_dtype(dtype)
    flat = w.reshape(-1).view(torch.uint8) if w.element_size() == 1 else w.reshape(-1)
    period = flat[:TILE_PERIOD]
    whole = flat.numel() // TILE_PERIOD
    for i in range(1, whole):
        assert torch.equal(flat[i * TILE_PERIOD : (i + 1) * TILE_PERIOD], period)
    tail = flat[whole * TILE_PERIOD :]
    assert tail.numel() > 0 and torch.equal(tail, period[: tail.numel()])
    # No row equals another: a kernel that reads the wrong row reads other values.
    heads = {tuple(r.tolist()) for r in w.reshape(rows, -1).view(torch.uint8)[:, :64]}
    assert len(heads) == rows
    assert torch.equal(
        w.view(torch.uint8), generate_inputs(spec, {"n": rows}, seed=3)["w"].view(torch.uint8)
    )
    # The same distribution as a fill drawn element by element.
    small = generate_inputs(spec, {"n": 256}, seed=3)["w"]
    if dtype in ("bfloat16", "float32", "int32", "int8"):
        big, each = w.float(), small.float()
        assert abs(float(big.mean() - each.mean())) < 0.05 * max(1.0, float(each.std()))
        assert abs(float(big.std() / each.std()) - 1) < 0.05
    # Below the threshold, nothing repeats.
    below = generate_inputs(spec, {"n": TILE_PERIOD // cols + 300}, seed=3)["w"].reshape(-1)
    below = below.view(torch.uint8) if below.element_size() == 1 else below
    assert not torch.equal(below[TILE_PERIOD : TILE_PERIOD + 256], below[:256])
