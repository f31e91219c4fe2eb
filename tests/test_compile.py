"""Routed calls inside torch.compile (Note [custom ops] in fibgen/runtime/routing/ops.py), on the CPU.

The model calls FlashInfer's rmsnorm and fused_add_rmsnorm (patched by enable_apply, their
kernels computing in torch here, see ``_flashinfer_cpu``) and a generated dispatcher directly
(silu_and_mul). Compiled with ``fullgraph=True, dynamic=True`` it must have no graph break,
compile once over calls of many batch sizes, give what eager gives, count every call, and
follow apply being turned off and on without compiling again.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from _shared import require_module

# Slow as a whole: torch.compile.
pytestmark = pytest.mark.slow

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import _flashinfer_cpu as cpu  # noqa: E402
import flashinfer  # noqa: E402
import fibgen.runtime as rt  # noqa: E402
from fibgen_kernels.silu_and_mul import silu_and_mul  # noqa: E402

torch._dynamo = pytest.importorskip("torch._dynamo")

HIDDEN, INTER = 4096, 12288
SOLVED: list[str] = []


def _rmsnorm(hidden_states, weight):
    SOLVED.append("rmsnorm")
    return cpu.rms(hidden_states, weight, 1e-5)


def _fused(hidden_states, residual, weight):
    SOLVED.append("fused")
    return cpu.rms(hidden_states + residual, weight, 1e-5)


def _silu(x):
    SOLVED.append("silu")
    return cpu.silu_and_mul(x)


SOLUTIONS = {
    "rmsnorm_h4096": _rmsnorm,
    "fused_add_rmsnorm_h4096": _fused,
    "silu_and_mul_h12288_bf16": _silu,
}


class _Config:
    # Read from an attribute and a global, as engines pass epsilon: under dynamic=True
    # Dynamo makes such floats symbolic, values no graph constant can hold.
    eps = 1e-5


EPS = 1e-5


def layer(x, residual, w, up):
    """A piece of a decoder layer: norm, MLP gate, residual add and norm."""
    h = flashinfer.norm.rmsnorm(x, w, _Config.eps)
    g = silu_and_mul(up)
    flashinfer.norm.fused_add_rmsnorm(h, residual, w, EPS, enable_pdl=True)
    return h, g, residual


def _inputs(batch, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, HIDDEN, generator=gen).bfloat16()
    r = torch.randn(batch, HIDDEN, generator=gen).bfloat16()
    up = torch.randn(batch, 2 * INTER, generator=gen).bfloat16()
    return x, r, up


@pytest.fixture
def on_cpu(monkeypatch):
    cpu.norm_kernels_on_cpu(monkeypatch)
    cpu.activation_kernels_on_cpu(monkeypatch)
    SOLVED.clear()
    torch._dynamo.reset()
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.disable_apply()
    torch._dynamo.reset()


class _Counting:
    """A backend that counts the graphs it compiles, then runs them as they are."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def test_the_model_traces_without_graph_breaks(on_cpu):
    rt.enable_apply(SOLUTIONS)
    x, r, up = _inputs(3)
    w = torch.randn(HIDDEN).bfloat16()
    explained = torch._dynamo.explain(layer)(x, r, w, up)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    ops = [
        str(node.target)
        for graph in explained.graphs
        for node in graph.graph.nodes
        if node.op == "call_function"
    ]
    # One fibgen op per routed call, named by its definition, in the namespace of the package
    # whose dispatcher routes it (`fibgen`, or `fibgen_<package>` where another test of this
    # process imported a package of its own that holds the definition too).
    named = {op.split(".", 1)[1] for op in ops if op.startswith("fibgen")}
    assert {
        "rmsnorm_h4096.default",
        "fused_add_rmsnorm_h4096.default",
        "silu_and_mul_h12288_bf16.default",
    } <= named, ops


def test_compiled_calls_are_routed_counted_and_equal_to_eager_without_recompiling(on_cpu):
    rt.enable_apply(SOLUTIONS)
    w = torch.randn(HIDDEN).bfloat16()
    backend = _Counting()
    compiled = torch.compile(layer, backend=backend, fullgraph=True, dynamic=True)
    calls = 0
    gen = torch.Generator().manual_seed(1)
    for i in range(1000):
        # From 2: torch specializes sizes 0 and 1 in every dynamic graph (its "0/1
        # specialization"), so a batch of 1 gets a graph of its own, fibgen or not.
        batch = int(torch.randint(2, 10, (1,), generator=gen))
        x, r, up = _inputs(batch, seed=i % 7)
        x2, r2, up2 = x.clone(), r.clone(), up.clone()
        got = compiled(x, r, w, up)
        calls += 1
        if i % 97 == 0:  # eager on the same inputs, now and then
            want = layer(x2, r2, w, up2)
            calls += 1
            for a, b in zip(got, want):
                assert torch.equal(a, b)
    assert backend.graphs == 1
    stats = rt.stats()
    for api in ("flashinfer.norm.rmsnorm", "flashinfer.norm.fused_add_rmsnorm"):
        assert (
            stats[api]["hit"] == calls
            and sum(v for k, v in stats[api].items() if k != "hit" and k != "rules") == 0
        )
    assert stats["flashinfer.activation.silu_and_mul"]["hit"] == calls
    assert SOLVED.count("rmsnorm") == calls


def test_apply_turned_off_and_on_takes_effect_without_recompiling(on_cpu):
    # Generated dispatchers called directly: the graph holds their ops, whose routing is
    # decided when they run.
    from fibgen_kernels.rmsnorm import rmsnorm

    def direct(x, w, up):
        return rmsnorm(x, w, 1e-5), silu_and_mul(up)

    w = torch.randn(HIDDEN).bfloat16()
    backend = _Counting()
    compiled = torch.compile(direct, backend=backend, fullgraph=True, dynamic=True)
    x, _, up = _inputs(4)
    for on in (True, False, True, False, True):
        if on:
            rt.enable_apply(SOLUTIONS, patch=False)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                rt.disable_apply()
        before = len(SOLVED)
        h, g = compiled(x, w, up)
        assert len(SOLVED) - before == (2 if on else 0)  # off: FlashInfer's own kernels
        assert torch.equal(h, cpu.rms(x, w, 1e-5)) and torch.equal(g, cpu.silu_and_mul(up))
    assert backend.graphs == 1


def test_patching_and_unpatching_costs_one_graph_per_state(on_cpu):
    # A model that calls flashinfer.norm.rmsnorm sees another function there once apply
    # patches it: one more graph, and no more however often apply is toggled after.
    w = torch.randn(HIDDEN).bfloat16()
    backend = _Counting()
    compiled = torch.compile(layer, backend=backend, fullgraph=True, dynamic=True)
    x, r, up = _inputs(4)
    for on in (False, True, False, True, False, True):
        if on:
            rt.enable_apply(SOLUTIONS)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                rt.disable_apply()
        compiled(x, r.clone(), w, up)
    assert backend.graphs == 2
    assert SOLVED.count("rmsnorm") == 3


def test_a_call_the_definition_does_not_describe_runs_eagerly_with_the_same_result(on_cpu):
    # rmsnorm over q/k heads (3-D): not the definition's, so not an op; FlashInfer runs it.
    def qk_norm(q, w):
        return flashinfer.norm.rmsnorm(q, w, 1e-5) * 2

    rt.enable_apply(SOLUTIONS)
    q = torch.randn(2, 8, HIDDEN).bfloat16()
    w = torch.randn(HIDDEN).bfloat16()
    compiled = torch.compile(qk_norm, backend=_Counting(), dynamic=True)
    assert torch.equal(compiled(q, w), qk_norm(q, w))
    assert "rmsnorm" not in SOLVED
    assert rt.stats()["flashinfer.norm.rmsnorm"]["rules"] == {"tensor:hidden_states": 2}


def test_a_wrong_shape_gets_the_same_message_compiled_as_eager(on_cpu):
    rt.enable_apply(SOLUTIONS, strict=True)
    x, w = torch.randn(2, HIDDEN).bfloat16(), torch.randn(HIDDEN - 1).bfloat16()

    def norm(x, w):
        return flashinfer.norm.rmsnorm(x, w, 1e-5)

    with pytest.raises(rt.FallbackError) as eager:
        norm(x, w)
    with pytest.raises(rt.FallbackError) as compiled:
        torch.compile(norm, backend=_Counting(), dynamic=True)(x, w)
    assert str(compiled.value) == str(eager.value)
    assert "input weight has size 4095 along axis hidden_size (dim 0), expected 4096" in str(
        eager.value
    )


def _gdn_step(q, k, v, state, A_log, a, dt_bias, b, scale):
    SOLVED.append("gdn")
    return v * 2, state + 1


def _gdn_inputs(batch):
    gen = torch.Generator().manual_seed(batch)

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen).to(dtype)

    q, k = randn(batch, 1, 4, 128), randn(batch, 1, 4, 128)
    v, state = randn(batch, 1, 8, 128), randn(batch, 8, 128, 128, dtype=torch.float32)
    a_log, dt_bias = randn(8, dtype=torch.float32), randn(8, dtype=torch.float32)
    return q, k, v, state, a_log, randn(batch, 1, 8), dt_bias, randn(batch, 1, 8)


def test_a_routed_gdn_call_returns_output_and_state_compiled_as_eager(on_cpu):
    # FlashInfer's gated_delta_rule_decode returns (output, state), `state` being the
    # caller's tensor it updated; the family's `returns` makes a routed call do the same,
    # in the graph as eagerly.
    def step(q, k, v, state, A_log, a, dt_bias, b):
        return flashinfer.gdn_decode.gated_delta_rule_decode(
            q, k, v, state, A_log, a, dt_bias, b, use_qk_l2norm=False
        )

    rt.enable_apply({"gdn_decode_qk4_v8_d128_k_last": _gdn_step})
    backend = _Counting()
    compiled = torch.compile(step, backend=backend, fullgraph=True, dynamic=True)
    for batch in (2, 3):
        inputs = _gdn_inputs(batch)
        again = tuple(x.clone() for x in inputs)
        want = step(*inputs)
        got = compiled(*again)
        assert isinstance(want, tuple) and len(want) == 2 and want[1] is inputs[3]
        assert isinstance(got, tuple) and len(got) == 2 and got[1] is again[3]
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert torch.equal(want[0], inputs[2] * 2)
    assert backend.graphs == 1
    assert SOLVED == ["gdn"] * 4
    assert rt.stats()["flashinfer.gdn_decode.gated_delta_rule_decode"]["hit"] == 4


def test_inductor_compiles_the_model(on_cpu):
    # The default backend, once: the ops' fake implementations give inductor every shape.
    rt.enable_apply(SOLUTIONS)
    w = torch.randn(HIDDEN).bfloat16()
    compiled = torch.compile(layer, fullgraph=True, dynamic=True)
    for batch in (1, 5, 16):
        x, r, up = _inputs(batch)
        got = compiled(x, r.clone(), w, up)
        want = layer(x, r.clone(), w, up)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
