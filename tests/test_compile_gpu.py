"""Routed calls under torch.compile and CUDA graphs on a GPU, with the real FlashInfer.

The CPU tests (test_compile.py) prove the tracing; these run the real kernels: FlashInfer's
own, and the shipped Triton solutions that ``enable_apply`` routes its ``rmsnorm``,
``fused_add_rmsnorm`` and ``silu_and_mul`` to. Compiled (inductor, ``fullgraph=True,
dynamic=True``), compiled with ``mode="reduce-overhead"`` (CUDA graphs), and captured by hand,
each must give what the same routed model gives eagerly, without compiling again as batch
sizes change. Skipped without a CUDA GPU or a FlashInfer whose kernels run.
"""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
flashinfer = pytest.importorskip("flashinfer")

import fibgen.runtime as rt  # noqa: E402
from fibgen.format.models import Solution  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HIDDEN, INTER, EPS = 4096, 14336, 1e-5


def _solution(name: str) -> Solution:
    (path,) = sorted((ROOT / "solutions").rglob(f"{name}.json"))
    return Solution.model_validate(json.loads(path.read_text(encoding="utf-8")))


ROUTES = {
    "rmsnorm_h4096": _solution("triton_rmsnorm_h4096"),
    "fused_add_rmsnorm_h4096": _solution("triton_fused_add_rmsnorm_h4096"),
    "silu_and_mul_h14336_bf16": _solution("triton_silu_and_mul_h14336_bf16"),
}
APIS = (
    "flashinfer.norm.rmsnorm",
    "flashinfer.norm.fused_add_rmsnorm",
    "flashinfer.activation.silu_and_mul",
)


def _weights():
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(HIDDEN, device="cuda", generator=gen).bfloat16() + 1
    up = (torch.randn(2 * INTER, HIDDEN, device="cuda", generator=gen) / 64).bfloat16()
    return w, up


W, UP = _weights()


def layer(x, residual):
    h = flashinfer.norm.rmsnorm(x, W, EPS)
    g = flashinfer.activation.silu_and_mul(h @ UP.T)
    flashinfer.norm.fused_add_rmsnorm(h, residual, W, EPS)
    return h, g, residual


def _inputs(batch, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(batch, HIDDEN, device="cuda", generator=gen).bfloat16()
    return x, torch.randn(batch, HIDDEN, device="cuda", generator=gen).bfloat16()


@pytest.fixture(scope="module", autouse=True)
def kernels_run():
    try:
        flashinfer.norm.rmsnorm(*_inputs(2)[:1], W, EPS)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"FlashInfer's kernels do not run here: {exc}")


@pytest.fixture
def routed():
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.enable_apply(ROUTES, strict=True)
    yield
    rt.disable_apply()
    torch._dynamo.reset()


def _hits():
    stats = rt.stats()
    return [stats[api]["hit"] for api in APIS]


def _equal(got, want):
    for a, b in zip(got, want):
        assert torch.equal(a, b), (a.float() - b.float()).abs().max().item()


def _unique_graphs():
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def test_compiled_model_is_routed_equal_to_eager_and_compiled_once(routed):
    explained = torch._dynamo.explain(layer)(*_inputs(4))
    assert explained.graph_break_count == 0
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, dynamic=True)
    rng = random.Random(0)
    compiled(*_inputs(3))
    before, hits, calls = _unique_graphs(), _hits(), 0
    for i in range(1000):
        batch = rng.randint(2, 64)
        x, r = _inputs(batch, seed=i % 5)
        got = compiled(x, r.clone())
        calls += 1
        if i % 100 == 0:
            _equal(got, layer(x, r.clone()))
            calls += 1
    assert _unique_graphs() == before, "compiled again"
    assert _hits() == [h + calls for h in hits]  # every call counted, eager or compiled


def test_reduce_overhead_replays_the_routed_kernels(routed):
    compiled = torch.compile(layer, mode="reduce-overhead", fullgraph=True, dynamic=False)
    for seed in range(6):  # warm-up, recording, then replays
        x, r = _inputs(8, seed=seed)
        got = [t.clone() for t in compiled(x, r.clone())]
        _equal(got, layer(x, r.clone()))
    assert all(h > 0 for h in _hits())


def test_manual_capture_and_replay_follow_new_inputs(routed):
    x, r = _inputs(16)
    static_x, static_r = x.clone(), r.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layer(static_x.clone(), static_r.clone())
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(static_x, static_r)
    for seed in range(1, 4):
        x, r = _inputs(16, seed=seed)
        static_x.copy_(x)
        static_r.copy_(r)
        graph.replay()
        _equal([t.clone() for t in out], layer(x, r.clone()))


def test_unrouted_compiled_model_equals_flashinfer_and_routed_is_within_tolerance():
    # FlashInfer's own APIs do not trace (its JIT loader stats files): unrouted, the model
    # compiles around them in pieces. Routed, it compiles whole.
    torch._dynamo.reset()
    x, r = _inputs(32)
    plain = [t.clone() for t in torch.compile(layer, dynamic=True)(x, r.clone())]
    _equal(plain, layer(x, r.clone()))
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.enable_apply(ROUTES, strict=True)
    try:
        routed = torch.compile(layer, fullgraph=True, dynamic=True)(x, r.clone())
        assert all(h > 0 for h in _hits())
    finally:
        rt.disable_apply()
        torch._dynamo.reset()
    for a, b in zip(routed, plain):
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)
