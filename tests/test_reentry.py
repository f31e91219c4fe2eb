"""A solution that calls the API it serves (Note [re-entry] in fibgen/runtime/routing/state.py).

FlashInfer-Bench's dataset gives every definition a baseline that calls the FlashInfer API
itself. With apply on, that API is patched: the call from inside the solution must reach the
original API once, counted as ``nested``, never as a hit, in every mode apply runs in.
"""

from __future__ import annotations

import threading

import pytest
import torch

import fake_flashinfer
import fake_flashinfer.norm
import fibgen.runtime as rt
from fake_flashinfer import CALLS
from fake_flashinfer.calls import clean_apply  # noqa: F401  (autouse)
from fake_flashinfer.catalogue import generated_package

generated_package()

from fake_kernels import fused_add_rmsnorm, rmsnorm  # noqa: E402  (generated just above)

RMS = "fake_flashinfer.norm.rmsnorm"
FUSED = "fake_flashinfer.norm.fused_add_rmsnorm"
ORIGINAL_RMSNORM = fake_flashinfer.norm.rmsnorm

pytestmark = pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning")


def wrapper_baseline(hidden_states, weight):
    """A FlashInfer-Bench-style baseline: the API itself, looked up through its module."""
    return fake_flashinfer.norm.rmsnorm(hidden_states, weight)


def _counts(label: str) -> dict[str, int]:
    return {k: v for k, v in rt.stats()[label].items() if v}


def test_a_solution_that_calls_the_api_it_serves_reaches_the_original_once():
    x, w = torch.randn(3, 4096), torch.randn(4096)
    with rt.enable_apply({"rmsnorm_h4096": wrapper_baseline}):
        assert fake_flashinfer.norm.rmsnorm is not ORIGINAL_RMSNORM  # patched
        for _ in range(50):
            y = fake_flashinfer.norm.rmsnorm(x, w)
        counts = _counts(RMS)
    # One dispatch per call: the outer one is the hit, the inner one the original's call.
    assert counts == {"hit": 50, "nested": 50}
    assert CALLS == ["rmsnorm"] * 50
    assert torch.equal(y, ORIGINAL_RMSNORM(x, w))


@pytest.mark.slow
def test_strict_mode_sends_nested_calls_to_the_original_too():
    x, w = torch.randn(2, 4096), torch.randn(4096)
    with rt.enable_apply({"rmsnorm_h4096": wrapper_baseline}, strict=True):
        y = fake_flashinfer.norm.rmsnorm(x, w)
        assert _counts(RMS) == {"hit": 1, "nested": 1}
    assert torch.equal(y, ORIGINAL_RMSNORM(x, w))


def test_a_call_of_another_patched_api_from_a_solution_is_nested():
    # fused_add_rmsnorm's solution normalizes through the patched rmsnorm: that call is not
    # rmsnorm's hit, although rmsnorm has a solution registered too.
    def fused(hidden_states, residual, weight, output, residual_out):
        residual_out.copy_(residual + hidden_states)
        output.copy_(fake_flashinfer.norm.rmsnorm(residual_out, weight))

    x, r, w = torch.randn(2, 4096), torch.randn(2, 4096), torch.randn(4096)
    want_r = r + x
    want_x = ORIGINAL_RMSNORM(want_r, w)
    with rt.enable_apply({"fused_add_rmsnorm_h4096": fused, "rmsnorm_h4096": wrapper_baseline}):
        fake_flashinfer.norm.fused_add_rmsnorm(x, r, w)
        assert _counts(FUSED) == {"hit": 1}
        assert _counts(RMS) == {"nested": 1}
    assert torch.allclose(r, want_r) and torch.allclose(x, want_x)


def test_a_solution_that_raises_after_a_nested_call_falls_back_like_any_error():
    def broken(hidden_states, weight):
        fake_flashinfer.norm.rmsnorm(hidden_states, weight)
        raise RuntimeError("kernel exploded")

    x, w = torch.randn(2, 4096), torch.randn(4096)
    with rt.enable_apply({"rmsnorm_h4096": broken}):
        with pytest.warns(RuntimeWarning, match="kernel exploded"):
            y = fake_flashinfer.norm.rmsnorm(x, w)
        counts = _counts(RMS)
    assert counts == {"error": 1, "nested": 1}
    # The inner call and the fallback each ran the original once.
    assert CALLS == ["rmsnorm", "rmsnorm"]
    assert torch.equal(y, ORIGINAL_RMSNORM(x, w))


def test_without_an_original_a_nested_call_runs_the_reference():
    # The dispatcher's own function (no patched API in between) with no original to call:
    # the nested call takes what a miss takes, the reference, once.
    from fibgen.runtime.routing.state import STATE

    api = next(a for a in STATE.apis if a.label == RMS)
    x, w = torch.randn(2, 4096), torch.randn(4096)

    def through_dispatcher(hidden_states, weight):
        return rmsnorm.rmsnorm(hidden_states, weight)

    saved = api.path
    api.path = "fake_flashinfer.norm.no_such_function"  # an API that is not installed
    try:
        with rt.enable_apply({"rmsnorm_h4096": through_dispatcher}, patch=False):
            assert api.original() is None
            y = rmsnorm.rmsnorm(x, w)
            counts = _counts(RMS)
    finally:
        api.path = saved
        rt.disable_apply()
    assert counts == {"hit": 1, "nested": 1}
    assert CALLS == []  # the original never ran
    assert torch.allclose(y, ORIGINAL_RMSNORM(x, w), atol=1e-6, rtol=1e-5)


def test_call_definition_is_a_routed_call_for_nested_calls():
    x, w = torch.randn(2, 4096), torch.randn(4096)
    from fibgen.runtime.routing.state import STATE

    api = next(a for a in STATE.apis if a.label == RMS)
    with rt.enable_apply({"rmsnorm_h4096": wrapper_baseline}):
        y = api.call_definition("rmsnorm_h4096", {"hidden_states": x, "weight": w})
        assert _counts(RMS) == {"hit": 1, "nested": 1}
    assert torch.equal(y, ORIGINAL_RMSNORM(x, w))


def test_another_threads_calls_are_routed_while_one_thread_serves():
    # Thread A is inside its solution (the counter is up) when thread B calls: B's call is
    # its own, routed to the solution, not a nested one.
    inside, release = threading.Event(), threading.Event()
    seen = []

    def solution(hidden_states, weight):
        if threading.current_thread().name == "a":
            inside.set()
            assert release.wait(10)
        seen.append(threading.current_thread().name)
        return hidden_states * 2

    x, w = torch.randn(2, 4096), torch.randn(4096)
    results = {}
    with rt.enable_apply({"rmsnorm_h4096": solution}):
        a = threading.Thread(
            target=lambda: results.setdefault("a", rmsnorm.rmsnorm(x, w)), name="a"
        )
        a.start()
        assert inside.wait(10)
        results["b"] = rmsnorm.rmsnorm(x, w)
        release.set()
        a.join(10)
        counts = _counts(RMS)
    assert counts == {"hit": 2}
    assert sorted(seen) == ["MainThread", "a"] and CALLS == []
    assert torch.equal(results["a"], x * 2) and torch.equal(results["b"], x * 2)


@pytest.mark.slow
def test_a_nested_call_under_torch_compile():
    x, w = torch.randn(4, 4096), torch.randn(4096)

    def model(x, w):
        return fake_flashinfer.norm.rmsnorm(x, w) + 1

    with rt.enable_apply({"rmsnorm_h4096": wrapper_baseline}):
        # aot_eager: dynamo and AOTAutograd trace the routed op as inductor's would, and the
        # call runs through the op as compiled code calls it. Inductor's own C++ build (20 s
        # cold) is covered once, in tests/test_compile.py.
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=False)
        y = compiled(x, w)
        hits = rt.stats()[RMS]["hit"]
        nested = rt.stats()[RMS]["nested"]
    assert hits >= 1 and nested == hits
    assert torch.equal(y, ORIGINAL_RMSNORM(x, w) + 1)


@pytest.mark.slow
def test_tracing_records_the_outer_call_only(tmp_path):
    from fibgen.runtime.tracing.tracer import disable_tracing, enable_tracing, tracing_stats

    x, w = torch.randn(3, 4096), torch.randn(4096)
    with rt.enable_apply({"rmsnorm_h4096": wrapper_baseline}):
        enable_tracing(tmp_path, dump="none", dedup="all")
        try:
            for _ in range(5):
                fake_flashinfer.norm.rmsnorm(x, w)
            recorded = tracing_stats()["recorded"]
        finally:
            disable_tracing()
        assert _counts(RMS) == {"hit": 5, "nested": 5}
    assert recorded == 5
