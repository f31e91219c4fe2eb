"""The runtime through generated dispatchers: routing, fallback, outputs, patching, stats."""

from __future__ import annotations

import importlib
import threading
import warnings

import json

import pytest
import torch

import fake_flashinfer
import fibgen.runtime as rt
from fake_flashinfer import CALLS
from fake_flashinfer.calls import clean_apply  # noqa: F401  (autouse)
from fake_flashinfer.catalogue import generated_package

# The module, not the function of the same name that fibgen.runtime exports.
apply_module = importlib.import_module("fibgen.runtime.routing.apply")
loading_module = importlib.import_module("fibgen.runtime.solutions.loading")
# Where Api.resolve asks whether a CUDA graph is being captured.
routing_module = importlib.import_module("fibgen.runtime.routing.api")

generated_package()

from fake_kernels import (  # noqa: E402  (generated just above)
    add_bias,
    fused_add_rmsnorm,
    gqa_paged_decode,
    moe,
    relu,
    rmsnorm,
)

# Most tests leave some registered solution unused on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning")

RMS = "fake_flashinfer.norm.rmsnorm"
ORIGINAL_RMSNORM = fake_flashinfer.norm.rmsnorm


def _doubling(hidden_states, weight):
    return hidden_states * 2


def _no_handwritten_routes(monkeypatch) -> None:
    # Hand-written code routes names (an earlier test's), or any name by a resolver.
    handwritten = importlib.import_module("fibgen.runtime.routing.handwritten")
    monkeypatch.setattr(handwritten, "resolvers", [])
    monkeypatch.setattr(handwritten, "routed_names", set())


def test_apply_off_calls_the_original_api():
    # Counts of an earlier enable stay readable after disable; calls with apply off add none.
    before = rt.stats()
    x, w = torch.randn(3, 4096), torch.randn(4096)
    assert torch.equal(rmsnorm.rmsnorm(x, w), ORIGINAL_RMSNORM(x, w))
    assert CALLS == ["rmsnorm", "rmsnorm"]
    assert rt.stats() == before


def test_hit_routes_to_the_solution_and_patches_aliases():
    x, w = torch.randn(3, 4096), torch.randn(4096)
    with rt.enable_apply({"rmsnorm_h4096": _doubling}):
        assert fake_flashinfer.norm.rmsnorm is rmsnorm.rmsnorm
        assert fake_flashinfer.rmsnorm is rmsnorm.rmsnorm
        assert torch.equal(fake_flashinfer.rmsnorm(x, w), x * 2)
    assert CALLS == []
    assert fake_flashinfer.norm.rmsnorm is ORIGINAL_RMSNORM
    assert fake_flashinfer.rmsnorm is ORIGINAL_RMSNORM
    assert rt.stats()[RMS] == {
        "hit": 1,
        "fallback_no_candidate": 0,
        "fallback_guard": 0,
        "fallback_unwarmed_in_capture": 0,
        "fallback_declined": 0,
        "error": 0,
        "nested": 0,
    }


def test_miss_falls_back_to_the_original():
    x, w = torch.randn(2, 2048), torch.randn(2048)
    with rt.enable_apply({"rmsnorm_h4096": _doubling}):
        assert torch.allclose(fake_flashinfer.norm.rmsnorm(x, w), ORIGINAL_RMSNORM(x, w))
        # Const values no instance declares still get a name, and miss.
        fake_flashinfer.norm.rmsnorm(torch.randn(1, 5), torch.randn(5))
    assert CALLS == ["rmsnorm", "rmsnorm", "rmsnorm"]
    assert rt.stats()[RMS]["fallback_no_candidate"] == 2


@pytest.mark.slow
def test_name_rule_reaches_a_solution_for_an_undeclared_size(monkeypatch):
    _no_handwritten_routes(monkeypatch)
    x, w = torch.randn(2, 8), torch.randn(8)
    # No instance declares it, so enable says so (it could be a typo); the name rule spells it.
    with pytest.warns(RuntimeWarning, match="is called 'rmsnorm_h8'"):
        applied = rt.enable_apply({"rmsnorm_h8": _doubling})
    with applied:
        assert torch.equal(rmsnorm.rmsnorm(x, w), x * 2)


def test_out_buffer_is_filled_and_returned():
    x, w = torch.randn(3, 4096), torch.randn(4096)
    out = torch.empty_like(x)
    with rt.enable_apply({"rmsnorm_h4096": _doubling}):
        result = rmsnorm.rmsnorm(x, w, out=out)
    assert result is out
    assert torch.equal(out, x * 2)


def test_destination_passing_solution_gets_the_callers_buffer_or_a_new_one():
    seen = []

    def dps(hidden_states, weight, output):
        seen.append(output)
        output.copy_(hidden_states + 1)

    x, w = torch.randn(3, 4096), torch.randn(4096)
    out = torch.empty_like(x)
    with rt.enable_apply({"rmsnorm_h4096": dps}):
        assert rmsnorm.rmsnorm(x, w, out=out) is out
        fresh = rmsnorm.rmsnorm(x, w)
    assert seen[0] is out and seen[1] is fresh
    assert torch.equal(out, x + 1) and torch.equal(fresh, x + 1)
    assert fresh.shape == (3, 4096) and fresh.dtype == torch.float32


def test_in_place_outputs_are_written_back():
    def fused(hidden_states, residual, weight):
        s = hidden_states + residual
        return s * weight, s

    x, r, w = torch.randn(2, 4096), torch.randn(2, 4096), torch.randn(4096)
    expected_sum = x + r
    with rt.enable_apply({"fused_add_rmsnorm_h4096": fused}):
        assert fake_flashinfer.norm.fused_add_rmsnorm(x, r, w) is None
    assert torch.equal(r, expected_sum)
    assert torch.equal(x, expected_sum * w)
    assert CALLS == []


def test_in_place_destination_passing_solution_writes_back_too():
    def fused(hidden_states, residual, weight, output, residual_out):
        residual_out.copy_(hidden_states + residual)
        output.copy_(residual_out * weight)

    x, r, w = torch.randn(2, 4096), torch.randn(2, 4096), torch.randn(4096)
    expected_sum = x + r
    with rt.enable_apply({"fused_add_rmsnorm_h4096": fused}):
        fused_add_rmsnorm.fused_add_rmsnorm(x, r, w)
    assert torch.equal(r, expected_sum) and torch.equal(x, expected_sum * w)


def _decode_inputs():
    wrapper = fake_flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper()
    indptr = torch.tensor([0, 1, 3], dtype=torch.int32)
    indices = torch.tensor([0, 1, 2], dtype=torch.int32)
    q = torch.randn(2, 4, 8, dtype=torch.bfloat16)
    cache = (torch.randn(3, 1, 2, 8, dtype=torch.bfloat16),) * 2
    return wrapper, indptr, indices, q, cache


def test_plan_inputs_are_captured_per_instance_and_used_at_run():
    received = {}

    def decode(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
        received.update(indptr=kv_indptr, indices=kv_indices, sm_scale=sm_scale, k=k_cache)
        return q + 1, torch.zeros(q.shape[:2])

    wrapper, indptr, indices, q, cache = _decode_inputs()
    with rt.enable_apply({"gqa_paged_decode_h4_kv2_d8_ps1": decode}):
        wrapper.plan(indptr, indices, None, 4, 2, 8, 1, sm_scale=0.5)
        out = wrapper.run(q, cache)
        both = wrapper.run(q, cache, return_lse=True)
        # Another wrapper that was never planned falls back.
        other = fake_flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper()
        other.run(q, cache)
        assert gqa_paged_decode._plans.get(wrapper) is not None
    # Disabling forgets every plan: a plan() made while unpatched would go unseen.
    assert gqa_paged_decode._plans.get(wrapper) is None
    assert received["indptr"] is indptr and received["indices"] is indices
    assert received["sm_scale"] == 0.5 and received["k"] is cache[0]
    assert torch.equal(out, q + 1)
    assert isinstance(both, tuple) and len(both) == 2
    assert CALLS == ["plan", "run"]
    label = "fake_flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run"
    # The never-planned wrapper is refused: fibgen saw no plan of it.
    assert rt.stats()[label]["hit"] == 2 and rt.stats()[label]["fallback_guard"] == 1
    assert rt.stats()[label]["rules"] == {"plan:unseen": 1}


@pytest.mark.slow
def test_plan_state_is_weakly_held():
    wrapper, indptr, indices, _, _ = _decode_inputs()
    with rt.enable_apply({}, strict=True):  # strict: patched with nothing to route
        wrapper.plan(indptr, indices, None, 4, 2, 8, 1)
        assert len(gqa_paged_decode._plans) == 1
        del wrapper
        assert len(gqa_paged_decode._plans) == 0


def test_failing_solution_falls_back_and_warns_once():
    calls = []

    def broken(hidden_states, weight):
        calls.append(1)
        raise RuntimeError("kernel exploded")

    x, w = torch.randn(1, 4096), torch.randn(4096)
    with rt.enable_apply({"rmsnorm_h4096": broken}):
        with pytest.warns(
            RuntimeWarning,
            match="broken for definition .rmsnorm_h4096. raised RuntimeError: kernel exploded",
        ):
            first = rmsnorm.rmsnorm(x, w)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            second = rmsnorm.rmsnorm(x, w)
    assert torch.equal(first, ORIGINAL_RMSNORM(x, w)) and torch.equal(second, first)
    assert len(calls) == 2 and CALLS == ["rmsnorm", "rmsnorm", "rmsnorm"]
    assert rt.stats()[RMS] == {
        "hit": 0,
        "fallback_no_candidate": 0,
        "fallback_guard": 0,
        "fallback_unwarmed_in_capture": 0,
        "fallback_declined": 0,
        "error": 2,
        "nested": 0,
    }


@pytest.mark.slow
def test_strict_error_names_definition_and_solution():
    def broken(hidden_states, weight):
        raise RuntimeError("kernel exploded")

    x, w = torch.randn(1, 4096), torch.randn(4096)
    with rt.enable_apply({"rmsnorm_h4096": broken}, strict=True):
        with pytest.raises(rt.SolutionError) as info:
            rmsnorm.rmsnorm(x, w)
    message = str(info.value)
    assert "rmsnorm_h4096" in message and "broken" in message and "kernel exploded" in message
    assert isinstance(info.value.__cause__, RuntimeError)
    assert CALLS == []
    assert rt.stats()[RMS]["error"] == 1 and rt.stats()[RMS]["hit"] == 0


def test_bad_callable_signature_is_rejected_at_enable():
    def wrong(x, w):
        return x

    with pytest.raises(rt.ApplyConfigError) as info:
        rt.enable_apply({"rmsnorm_h4096": wrong})
    assert "rmsnorm_h4096" in str(info.value)
    assert "hidden_states, weight" in str(info.value)
    assert not rt.is_enabled()


def test_capture_applies_only_names_resolved_before(monkeypatch):
    x4, w4 = torch.randn(1, 4096), torch.randn(4096)
    x2, w2 = torch.randn(1, 2048), torch.randn(2048)
    with rt.enable_apply({"rmsnorm_h4096": _doubling, "rmsnorm_h2048": _doubling}):
        rmsnorm.rmsnorm(x4, w4)  # resolved before capture
        monkeypatch.setattr(routing_module, "is_capturing", lambda: True)
        assert torch.equal(rmsnorm.rmsnorm(x4, w4), x4 * 2)
        rmsnorm.rmsnorm(x2, w2)
        rmsnorm.rmsnorm(x2, w2)
        monkeypatch.setattr(routing_module, "is_capturing", lambda: False)
        assert torch.equal(rmsnorm.rmsnorm(x2, w2), x2 * 2)
    assert CALLS == ["rmsnorm", "rmsnorm"]
    counts = rt.stats()[RMS]
    assert counts["hit"] == 3 and counts["fallback_unwarmed_in_capture"] == 2


def test_disable_warns_about_solutions_never_hit():
    rt.enable_apply({"rmsnorm_h4096": _doubling, "rmsnorm_h2048": _doubling})
    rmsnorm.rmsnorm(torch.randn(1, 4096), torch.randn(4096))
    with pytest.warns(RuntimeWarning, match=r"never matched a call: rmsnorm_h2048$"):
        rt.disable_apply()


def test_enabling_again_replaces_the_mapping():
    x, w = torch.randn(1, 4096), torch.randn(4096)
    rt.enable_apply({"rmsnorm_h4096": _doubling})
    assert torch.equal(rmsnorm.rmsnorm(x, w), x * 2)
    rt.enable_apply({"rmsnorm_h4096": lambda hidden_states, weight: hidden_states * 3})
    assert torch.equal(rmsnorm.rmsnorm(x, w), x * 3)
    assert rt.stats()[RMS]["hit"] == 1


def test_dispatch_group_routes_by_the_selected_family():
    h, logits = torch.randn(3, 16), torch.randn(3, 8)
    mapping = {
        "moe_ds_routing_topk2_e8": lambda hidden_states, router_logits: hidden_states + 2,
        "moe_renorm_e8_h16": lambda hidden_states, router_logits: hidden_states + 1,
    }
    with rt.enable_apply(mapping):
        api = fake_flashinfer.fused_moe.moe
        assert api is moe.moe
        assert torch.equal(api(h, logits, 2, top_k=2), h + 2)
        assert torch.equal(api(h, logits, 1, top_k=2), h + 1)
        # Another top_k names another definition; an unknown routing method has no family.
        assert torch.equal(api(h, logits, 2, top_k=4), torch.zeros_like(h))
        assert torch.equal(api(h, logits, 5), torch.zeros_like(h))
        # The renorm definition's top_k is not in its name: a call must still agree with it.
        assert torch.equal(api(h, logits, 1, top_k=3), torch.zeros_like(h))
    assert CALLS == ["moe", "moe", "moe"]
    counts = rt.stats()["fake_flashinfer.fused_moe.moe"]
    assert counts["hit"] == 2 and counts["fallback_no_candidate"] == 2
    assert counts["fallback_guard"] == 1 and counts["rules"] == {"top_k": 1}


def test_dtype_generic_family_routes_each_dtype_to_its_solution():
    mapping = {
        "relu_h64_bf16": lambda x: torch.full_like(x, 1),
        "relu_h64_fp16": lambda x: torch.full_like(x, 2),
    }
    with rt.enable_apply(mapping):
        bf = relu.relu(torch.randn(2, 64, dtype=torch.bfloat16))
        fp = relu.relu(torch.randn(2, 64, dtype=torch.float16))
        relu.relu(torch.randn(2, 64))  # float32 names no definition of the family
    assert bf.dtype == torch.bfloat16 and torch.all(bf == 1)
    assert fp.dtype == torch.float16 and torch.all(fp == 2)
    assert CALLS == ["relu"]


def test_family_without_api_falls_back_to_its_reference():
    x, b = torch.randn(2, 8), torch.randn(8)
    assert torch.equal(add_bias.add_bias(x, b), x + b)
    y = torch.empty(2, 8)
    with rt.enable_apply({"add_bias_h8": lambda x, bias: x - bias}):
        assert add_bias.add_bias(x, b, y=y) is y
        assert torch.equal(y, x - b)
        assert torch.equal(
            add_bias.add_bias(torch.ones(1, 3), torch.ones(3)), torch.full((1, 3), 2.0)
        )
    assert rt.stats()["fake_kernels.add_bias"]["hit"] == 1


@pytest.mark.slow
def test_stats_are_exact_under_threads():
    x, w = torch.randn(1, 4096), torch.randn(4096)
    x2, w2 = torch.randn(1, 2048), torch.randn(2048)
    loads = []

    def solution(hidden_states, weight):
        return hidden_states

    rt.enable_apply({"rmsnorm_h4096": solution})
    original_load = loading_module.load

    def counting_load(*args):
        loads.append(1)
        return original_load(*args)

    loading_module.load = counting_load
    try:
        start = threading.Barrier(8)

        def work(i):
            start.wait()
            for _ in range(10_000):
                if i % 2:
                    rmsnorm.rmsnorm(x, w)
                else:
                    rmsnorm.rmsnorm(x2, w2)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        loading_module.load = original_load
    counts = rt.stats()[RMS]
    assert counts["hit"] == 40_000 and counts["fallback_no_candidate"] == 40_000
    assert len(loads) == 1


@pytest.mark.slow
def test_decorator_and_function_form_for_hand_written_code():
    @rt.apply("my_op_v1")
    def my_op(a, b):
        return a + b

    @rt.apply(lambda a, b: f"my_op_v{a}")
    def my_op_resolved(a, b):
        return a + b

    assert my_op(1, 2) == 3
    with rt.enable_apply({"my_op_v1": lambda a, b: a * b, "my_op_v4": lambda a, b: a - b}):
        assert my_op(3, 4) == 12
        assert my_op_resolved(4, 1) == 3
        assert my_op_resolved(5, 1) == 6
        assert rt.apply("my_op_v4", (9, 2), {}, fallback=lambda a, b: 0) == 7
        assert rt.apply("nothing", (9, 2), {}, fallback=lambda a, b: 0) == 0
    counts = rt.stats()
    assert (
        counts[f"{__name__}.test_decorator_and_function_form_for_hand_written_code.<locals>.my_op"][
            "hit"
        ]
        == 1
    )


def test_the_function_form_routes_once_per_name_whatever_fallback_each_call_gives():
    # Note [the function form's fallback]: a fresh lambda per call is the common spelling.
    from fibgen.runtime.routing.state import STATE

    x, w = torch.ones(2, 4096, dtype=torch.bfloat16), torch.ones(4096, dtype=torch.bfloat16)
    seen = []

    def solution(hidden_states, weight):
        # A solution that calls apply itself gets its own call's fallback, and the outer
        # call's fallback is back in place after it.
        inner = rt.apply("rmsnorm_h2048", (x[:, :2048], w[:2048]), fallback=lambda a, b: "inner")
        seen.append(inner)
        return hidden_states

    with rt.enable_apply({"rmsnorm_h4096": solution}):
        assert rt.apply("rmsnorm_h4096", (x, w), fallback=lambda a, b: "first") is x
        apis = len(STATE.apis)
        for i in range(50):
            assert rt.apply("rmsnorm_h4096", (x, w), fallback=lambda a, b, i=i: i) is x
            # A miss runs the fallback this call gave, not one an earlier call gave.
            assert rt.apply("rmsnorm_h1024", (x, w), fallback=lambda a, b, i=i: -i) == -i
        assert len(STATE.apis) == apis + 1  # rmsnorm_h1024's, once
        with pytest.raises(ZeroDivisionError):
            rt.apply("rmsnorm_h1024", (x, w), fallback=lambda a, b: 1 / 0)
        assert rt.apply("rmsnorm_h1024", (x, w), fallback=lambda a, b: "after") == "after"
    assert seen == ["inner"] * 51
    counts = rt.stats()
    assert counts["fibgen.runtime.apply('rmsnorm_h4096')"]["hit"] == 51
    # Called while a routed call is in progress: nested (Note [re-entry]), never a hit.
    assert counts["fibgen.runtime.apply('rmsnorm_h2048')"]["nested"] == 51
    assert counts["fibgen.runtime.apply('rmsnorm_h1024')"]["fallback_no_candidate"] == 52

    def calls_then_fails(hidden_states, weight):
        seen.append(rt.apply("rmsnorm_h2048", (x[:, :2048], w[:2048]), fallback=lambda a, b: 0))
        raise RuntimeError("after its inner call")

    with pytest.warns(RuntimeWarning, match="after its inner call"):
        with rt.enable_apply({"rmsnorm_h4096": calls_then_fails}):
            # The inner call had its own fallback; the outer call's is back for its failure.
            assert rt.apply("rmsnorm_h4096", (x, w), fallback=lambda a, b: "outer") == "outer"
    assert seen[-1] == 0


def test_calls_made_by_a_fallback_are_routed_like_any_other():
    # A layer with no solution of its own runs the caller's code, whose kernels are routed;
    # only calls made while a solution serves one are nested (Note [re-entry]).
    def tensors(hidden):
        return torch.ones(2, hidden, dtype=torch.bfloat16), torch.ones(hidden, dtype=torch.bfloat16)

    (x, w), (y, v) = tensors(1536), tensors(2048)

    def kernel(hidden_states, weight):
        return hidden_states

    def raising(hidden_states, weight):
        raise RuntimeError("this solution fails")

    def layer_code(hidden_states, weight):
        return rt.apply("rmsnorm_h2048", (y, v), fallback=lambda a, b: "not routed")

    @rt.apply("rmsnorm_h1536")
    def layer(hidden_states, weight):
        return layer_code(hidden_states, weight)

    def inner_counts():
        inner = rt.stats()["fibgen.runtime.apply('rmsnorm_h2048')"]
        return inner["hit"], inner["nested"], inner["fallback_no_candidate"]

    with rt.enable_apply({"rmsnorm_h2048": kernel}):
        assert rt.apply("rmsnorm_h1536", (x, w), fallback=layer_code) is y  # a miss
        assert layer(x, w) is y  # a miss
        assert inner_counts() == (2, 0, 0)
    with pytest.warns(RuntimeWarning, match="this solution fails"):
        with rt.enable_apply({"rmsnorm_h2048": kernel, "rmsnorm_h1536": raising}):
            assert rt.apply("rmsnorm_h1536", (x, w), fallback=layer_code) is y  # its error
            assert inner_counts() == (1, 0, 0)
            assert rt.stats()["fibgen.runtime.apply('rmsnorm_h1536')"]["error"] == 1


def test_a_resolver_given_per_call_routes_by_the_name_it_returns():
    from fibgen.runtime.routing.state import STATE

    x, w = torch.ones(2, 4096, dtype=torch.bfloat16), torch.ones(4096, dtype=torch.bfloat16)
    with rt.enable_apply({"rmsnorm_h4096": lambda hidden_states, weight: hidden_states}):
        rt.apply(lambda a, b: f"rmsnorm_h{a.shape[-1]}", (x, w), fallback=lambda a, b: None)
        apis = len(STATE.apis)
        for _ in range(20):
            resolver = lambda a, b: f"rmsnorm_h{a.shape[-1]}"  # noqa: E731  (fresh per call)
            assert rt.apply(resolver, (x, w), fallback=lambda a, b: None) is x
        assert len(STATE.apis) == apis
        assert rt.stats()["fibgen.runtime.apply('rmsnorm_h4096')"]["hit"] == 21
        with pytest.raises(TypeError, match=r"resolver .*<lambda>' returned 4096, not a def"):
            rt.apply(lambda a, b: a.shape[-1], (x, w), fallback=lambda a, b: None)


def test_function_form_mistakes_are_said_plainly():
    x, w = torch.ones(2, 4096, dtype=torch.bfloat16), torch.ones(4096, dtype=torch.bfloat16)

    def fallback(hidden_states, weight):
        return "fallback"

    with pytest.raises(TypeError, match="kwargs is a function, not a mapping of keyword"):
        rt.apply("rmsnorm_h4096", (x, w), fallback)
    with pytest.raises(TypeError, match=r"args is a Tensor; pass the call's positional arg"):
        rt.apply("rmsnorm_h4096", x, fallback=fallback)
    with pytest.raises(TypeError, match="no arguments to call with; pass args= or kwargs="):
        rt.apply("rmsnorm_h4096", fallback=fallback)
    with pytest.raises(TypeError, match=r"the target is a int \(4096\); give a definition name"):
        rt.apply(4096, (x, w), fallback=fallback)
    with pytest.raises(TypeError, match="fallback is a str, not callable"):
        rt.apply("rmsnorm_h4096", (x, w), fallback="fallback")
    assert rt.apply("rmsnorm_h4096", [x, w], fallback=fallback) == "fallback"  # a list is fine


def test_a_name_nothing_defines_is_said_once_with_the_closest_names():
    x, w = torch.ones(2, 4096, dtype=torch.bfloat16), torch.ones(4096, dtype=torch.bfloat16)

    @rt.apply("rmsnorm_h4069")
    def misspelt(hidden_states, weight):
        return "fallback"

    with rt.enable_apply({"rmsnorm_h4096": lambda hidden_states, weight: hidden_states}):
        with pytest.warns(RuntimeWarning) as said:
            assert misspelt(x, w) == "fallback"
        (warning,) = [w for w in said if "rmsnorm_h4069" in str(w.message)]
        assert "no definition of it is in fibgen's catalogue (did you mean" in str(warning.message)
        assert "'rmsnorm_h4096'" in str(warning.message)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert misspelt(x, w) == "fallback"  # said once
            # A name the routing table has, or the catalogue defines, is not said.
            assert rt.apply("rmsnorm_h2048", (x, w), fallback=lambda a, b: 0) == 0


def test_the_reference_fallback_follows_the_dataset_apply_is_enabled_on(tmp_path):
    from _bench_dataset import make_dataset

    def dataset(root, hidden):
        make_dataset(root, ["good_returns"])  # a solution, so that apply is on the dataset
        definition = {
            "name": "mynorm",
            "op_type": "norm",
            "axes": {"n": {"type": "var"}, "h": {"type": "const", "value": hidden}},
            "inputs": {"x": {"shape": ["n", "h"], "dtype": "float32"}},
            "outputs": {"y": {"shape": ["n", "h"], "dtype": "float32"}},
            "reference": "def run(x):\n    return x * 2\n",
        }
        (root / "definitions" / "norm").mkdir(parents=True, exist_ok=True)
        (root / "definitions" / "norm" / "mynorm.json").write_text(json.dumps(definition))
        return root

    x64 = torch.ones(3, 64)
    with pytest.warns(RuntimeWarning, match="without a fallback"):
        with rt.enable_apply(dataset(tmp_path / "w64", 64)):
            assert torch.equal(rt.apply("mynorm", (x64,)), x64 * 2)
    with rt.enable_apply(dataset(tmp_path / "w256", 256)):
        with pytest.raises(ValueError, match="input x has size 64 along axis h .* is 256"):
            rt.apply("mynorm", (x64,))


def test_what_a_hand_written_value_style_call_returns_is_checked():
    # Note [hand-written results]: as a generated dispatcher checks a value-returning solution.
    x, w = torch.ones(5, 4096, dtype=torch.bfloat16), torch.ones(4096, dtype=torch.bfloat16)

    def as_float32(hidden_states, weight):
        return hidden_states.float()

    def a_row_short(hidden_states, weight):
        return hidden_states[1:]

    def a_list(hidden_states, weight):
        return [hidden_states]

    def a_string(hidden_states, weight):
        return "done"

    # Each a function of its own: what a solution did wrong is said once per solution.
    wrong = {f.__name__: f for f in (as_float32, a_row_short, a_list, a_string)}
    for why, solution in wrong.items():
        with pytest.warns(RuntimeWarning, match="returned .* as output 'output'; expected a bfl"):
            with rt.enable_apply({"rmsnorm_h4096": solution}):
                assert rt.apply("rmsnorm_h4096", (x, w), fallback=lambda a, b: "fb") == "fb", why
                by_name = {"hidden_states": x, "weight": w}
                assert rt.apply("rmsnorm_h4096", None, by_name, fallback=lambda **k: "fb") == "fb"
                mixed = rt.apply(
                    "rmsnorm_h4096", (x,), {"weight": w}, fallback=lambda *a, **k: "fb"
                )
                assert mixed == "fb"
                assert rt.stats()["fibgen.runtime.apply('rmsnorm_h4096')"]["error"] == 3, why
    with rt.enable_apply({"rmsnorm_h4096": as_float32}, strict=True):
        with pytest.raises(
            rt.SolutionError, match=r"expected a bfloat16 tensor of shape \[5, 4096\]"
        ):
            rt.apply("rmsnorm_h4096", (x, w), fallback=lambda a, b: "fb")
    # A right result is returned as it is; a destination-passing call has nothing returned to
    # check (its outputs are the caller's).
    with rt.enable_apply({"rmsnorm_h4096": lambda hidden_states, weight: hidden_states}):
        assert rt.apply("rmsnorm_h4096", (x, w), fallback=lambda a, b: "fb") is x
    assert rt.stats()["fibgen.runtime.apply('rmsnorm_h4096')"]["hit"] == 1
    # None is what in-place code returns, as FlashInfer's in-place APIs do: taken as given,
    # never followed by the fallback (which would apply the effect twice).
    residual = torch.ones(5, 4096, dtype=torch.bfloat16)

    def in_place(hidden_states, residual, weight):
        residual.add_(hidden_states)

    with rt.enable_apply({"fused_add_rmsnorm_h4096": in_place}):
        fallback = lambda a, r, b: r.add_(a)  # noqa: E731
        assert rt.apply("fused_add_rmsnorm_h4096", (x, residual, w), fallback=fallback) is None
    assert torch.equal(residual, torch.full_like(residual, 2))


def test_a_failed_solutions_fallback_is_not_nested_while_another_call_is_served():
    # The re-entry test reads the frames of calls being served: once the solution has failed,
    # its call's frame says so no more, whatever other threads serve meanwhile.
    from fibgen.runtime.routing.state import SERVING

    (x, w), (y, v) = (
        (torch.ones(2, h, dtype=torch.bfloat16), torch.ones(h, dtype=torch.bfloat16))
        for h in (1536, 2048)
    )

    def raising(hidden_states, weight):
        raise RuntimeError("fails here")

    def fallback(hidden_states, weight):
        return rt.apply("rmsnorm_h2048", (y, v), fallback=lambda a, b: "not routed")

    with pytest.warns(RuntimeWarning, match="fails here"):
        served = {"rmsnorm_h1536": raising, "rmsnorm_h2048": lambda hidden_states, weight: y}
        with rt.enable_apply(served):
            SERVING.n += 1  # as while another thread's call is served
            try:
                assert rt.apply("rmsnorm_h1536", (x, w), fallback=fallback) is y
            finally:
                SERVING.n -= 1
            inner = rt.stats()["fibgen.runtime.apply('rmsnorm_h2048')"]
            assert (inner["hit"], inner["nested"]) == (1, 0)


def test_hand_written_calls_whose_inputs_are_not_the_definitions_go_to_the_fallback():
    # Note [hand-written inputs]: a generated dispatcher refuses such calls before any
    # solution sees them; hand-written code, routed by name, gets the same check.
    seen = []

    def solution(hidden_states, weight, **options):
        seen.append(tuple(hidden_states.shape))
        return hidden_states

    def fallback(*args, **kwargs):
        return "fallback"

    def tensors(rows, hidden, dtype=torch.bfloat16):
        return torch.ones(rows, hidden, dtype=dtype), torch.ones(hidden, dtype=dtype)

    name = "rmsnorm_h4096"  # fibgen's catalogue: hidden_size is 4096, bfloat16
    with rt.enable_apply({name: solution}):
        assert rt.apply(name, tensors(3, 4096), fallback=fallback) != "fallback"  # served
        x, w = tensors(2, 4096)
        assert rt.apply(name, (), {"weight": w, "hidden_states": x}, fallback=fallback) is x
        with pytest.warns(RuntimeWarning, match="size 100 along axis hidden_size .* is 4096"):
            assert rt.apply(name, tensors(3, 100), fallback=fallback) == "fallback"
        assert rt.apply(name, tensors(3, 100), fallback=fallback) == "fallback"  # said once
        assert rt.apply(name, tensors(3, 4096, torch.float32), fallback=fallback) == "fallback"
        three_dims = (torch.ones(2, 3, 4096, dtype=torch.bfloat16), tensors(1, 4096)[1])
        assert rt.apply(name, three_dims, fallback=fallback) == "fallback"
        # Arguments that are not the definition's inputs are passed on as given.
        assert rt.apply(name, tensors(3, 100), {"eps": 1e-6}, fallback=fallback) != "fallback"

        @rt.apply(name)
        def decorated(hidden_states, weight):
            return "decorated fallback"

        assert decorated(*tensors(5, 4096)) != "decorated fallback"
        with pytest.warns(RuntimeWarning, match=r"apply\('rmsnorm_h4096'\) in .*decorated: input"):
            assert decorated(*tensors(5, 128)) == "decorated fallback"
    assert seen == [(3, 4096), (2, 4096), (3, 100), (5, 4096)]
    counts = rt.stats()
    mine = counts[f"fibgen.runtime.apply({name!r})"]
    assert mine["hit"] == 3 and mine["fallback_guard"] == 4
    assert mine["rules"] == {"tensor:hidden_states": 4}
    theirs = counts[f"{__name__}.{decorated.__wrapped__.__qualname__}"]
    assert theirs["hit"] == 1 and theirs["rules"] == {"tensor:hidden_states": 1}


def test_a_destination_passing_calls_buffers_are_checked_as_its_inputs_are():
    # A wrong buffer is the caller's mistake: it goes to the fallback as a guard, said, and
    # never reaches the solution (which would fail, or broadcast into it, or convert).
    seen = []

    def solution(hidden_states, weight):
        seen.append(tuple(hidden_states.shape))
        return hidden_states

    def fallback(hidden_states, weight, output):
        output.fill_(7)
        return "fallback"

    name = "rmsnorm_h4096"
    x, w = torch.ones(2, 4096, dtype=torch.bfloat16), torch.ones(4096, dtype=torch.bfloat16)
    bad = {
        "a row short": torch.zeros(1, 4096, dtype=torch.bfloat16),
        "float32": torch.zeros(2, 4096),
        "rank 3": torch.zeros(3, 2, 4096, dtype=torch.bfloat16),
    }
    with rt.enable_apply({name: solution}):
        assert rt.apply(name, (x, w), fallback=fallback) is x  # served
        with pytest.warns(RuntimeWarning, match="output output has size 1 along axis batch_size"):
            assert rt.apply(name, (x, w, bad["a row short"]), fallback=fallback) == "fallback"
        for buffer in (bad["float32"], bad["rank 3"]):
            assert rt.apply(name, (x, w), {"output": buffer}, fallback=fallback) == "fallback"
    assert seen == [(2, 4096)]
    assert all(torch.equal(b, torch.full_like(b, 7)) for b in bad.values())  # the fallback's
    counts = rt.stats()[f"fibgen.runtime.apply({name!r})"]
    assert (counts["hit"], counts["fallback_guard"], counts["error"]) == (1, 3, 0)
    assert counts["rules"] == {"tensor:output": 3}


def test_a_call_of_another_signature_goes_to_the_fallback_unless_the_solution_takes_it():
    # An engine's rms(x, w, eps), decorated with its definition's name: eps is neither an
    # output buffer nor a keyword the definition has. A solution made to take more (here
    # **options) gets such calls as given.
    def solution(hidden_states, weight):
        return hidden_states

    def lenient(hidden_states, weight, **options):
        return hidden_states

    name = "rmsnorm_h4096"
    x, w = torch.ones(2, 4096, dtype=torch.bfloat16), torch.ones(4096, dtype=torch.bfloat16)

    @rt.apply(name)
    def rms(x, w, eps=1e-5):
        return "own"

    with rt.enable_apply({name: solution}):
        assert rms(x, w) is x
        with pytest.warns(RuntimeWarning, match="output output is a float, not a tensor"):
            assert rms(x, w, 1e-5) == "own"
        with pytest.warns(RuntimeWarning, match="unexpected or repeated argument 'eps'"):
            assert rms(x, w, eps=1e-6) == "own"
        counts = rt.stats()[f"{__name__}.{rms.__wrapped__.__qualname__}"]
    assert (counts["hit"], counts["fallback_guard"], counts["error"]) == (1, 2, 0)
    assert counts["rules"] == {"tensor:output": 1, "arguments": 1}
    with rt.enable_apply({name: lenient}):
        assert rms(x, w, eps=1e-6) is x  # taken as given
        assert rt.stats()[f"{__name__}.{rms.__wrapped__.__qualname__}"]["hit"] == 1


def test_a_one_byte_float_input_may_come_as_its_bytes_and_nothing_else():
    # FlashInfer passes fp8 and packed fp4 tensors as uint8 as often as not.
    from fibgen.runtime.routing.handwritten import _input_check

    definition = {
        "axes": {"n": {"type": "var"}, "k": {"type": "const", "value": 16}},
        "inputs": {
            "a": {"shape": ["n", "k"], "dtype": "float8_e4m3fn"},
            "scale": {"shape": ["n"], "dtype": "float32"},
        },
        "outputs": {"y": {"shape": ["n", "k"], "dtype": "bfloat16"}},
    }
    check = _input_check(definition).any_call
    assert check((torch.zeros(2, 16, dtype=torch.uint8), torch.ones(2)), {}) is None
    assert (
        check((), {"a": torch.zeros(2, 16, dtype=torch.float8_e4m3fn), "scale": torch.ones(2)})
        is None
    )
    assert check((torch.zeros(2, 8, dtype=torch.uint8), torch.ones(2)), {}) == (
        "a",
        "input a has size 8 along axis k (dim 1), the definition's is 16",
    )
    assert check((torch.zeros(2, 16, dtype=torch.uint8), torch.ones(2).double()), {})[0] == "scale"
    assert check((torch.zeros(2, 16, dtype=torch.int8), torch.ones(2)), {}) is None
    for wrong in (torch.float32, torch.bfloat16, torch.int64, torch.float8_e5m2):
        assert check((torch.zeros(2, 16, dtype=wrong), torch.ones(2)), {}) == (
            "a",
            f"input a is {str(wrong).removeprefix('torch.')}, the definition's is "
            "float8_e4m3fn (or its bytes as uint8 or int8)",
        )


def test_hand_written_calls_whose_inputs_are_not_the_definitions_raise_in_strict_mode():
    x, w = torch.ones(3, 100, dtype=torch.bfloat16), torch.ones(100, dtype=torch.bfloat16)
    with rt.enable_apply({"rmsnorm_h4096": lambda hidden_states, weight: x}, strict=True):
        with pytest.raises(rt.FallbackError, match="rmsnorm_h4096 is not routed: input "):
            rt.apply("rmsnorm_h4096", (x, w), fallback=lambda *a: None)


def test_the_reference_standing_in_for_a_fallback_refuses_inputs_not_the_definitions():
    # rmsnorm_h2048: a name no other test here refuses, so its warning is said here (warnings
    # are said once per process).
    x, w = torch.ones(3, 100, dtype=torch.bfloat16), torch.ones(100, dtype=torch.bfloat16)
    with pytest.warns(RuntimeWarning, match="not given to the solution"):
        with rt.enable_apply({"rmsnorm_h2048": lambda hidden_states, weight: x}):
            with pytest.raises(ValueError, match="reference can be given this call: input hidden"):
                rt.apply("rmsnorm_h2048", (x, w))
    with pytest.raises(ValueError, match="input weight has size 100 along axis hidden_size"):
        rt.apply("rmsnorm_h2048", (torch.ones(3, 2048, dtype=torch.bfloat16), w))


def test_enabling_an_empty_mapping_or_a_solution_file_as_a_dataset_says_so(tmp_path):
    with pytest.warns(RuntimeWarning, match=r"enable_apply\(\{\}\): no solution given"):
        rt.enable_apply({})
    rt.disable_apply()
    path = tmp_path / "s.json"
    path.write_text('{"name": "s", "definition": "rmsnorm_h4096"}')
    with pytest.raises(rt.ApplyConfigError) as error:
        rt.enable_apply(str(path))
    assert str(error.value) == (
        f"apply path {path} is a file; a Solution JSON is given under the definition it "
        f"serves, enable_apply({{'rmsnorm_h4096': {str(path)!r}}}), and a dataset as its folder"
    )


def test_a_key_that_cannot_be_read_names_the_argument_in_strict_mode():
    with rt.enable_apply({"rmsnorm_h4096": _doubling}, strict=True):
        with pytest.raises(rt.FallbackError) as error:
            rmsnorm.rmsnorm([[1.0] * 4096], torch.ones(4096))
    assert str(error.value) == (
        f"{RMS}: the call is not routed: its key could not be read from its arguments: input "
        "hidden_states is a list, not a tensor (strict)"
    )


def _fused_add_rmsnorm(hidden_states, residual, weight):
    s = hidden_states.float() + residual.float()
    rms = torch.rsqrt(s.square().mean(dim=-1, keepdim=True) + 1e-6)
    return (s * rms * weight.float()).to(hidden_states.dtype)


def test_effect_writes_what_the_definition_leaves_out():
    # The catalogue's fused_add_rmsnorm has one output, the normalized rows, as the dataset's
    # definition does; its `effect residual = hidden_states + residual` makes a routed call
    # also leave the sum in `residual`, as FlashInfer's kernel does.
    from fibgen_kernels.fused_add_rmsnorm import fused_add_rmsnorm as dispatcher

    seen = []

    def solution(hidden_states, residual, weight):
        seen.append(residual.clone())
        return _fused_add_rmsnorm(hidden_states, residual, weight)

    def dps_solution(hidden_states, residual, weight, output):
        output.copy_(solution(hidden_states, residual, weight))

    for registered in (solution, dps_solution):
        x, r, w = (torch.randn(*s, dtype=torch.bfloat16) for s in ((3, 4096), (3, 4096), (4096,)))
        x0, r0 = x.clone(), r.clone()
        with rt.enable_apply({"fused_add_rmsnorm_h4096": registered}):
            # Llama-3.1-8B's epsilon, which the definition's reference uses.
            assert dispatcher(x, r, w, 1e-5) is None
        # The solution saw the residual as the caller passed it; the sum came after.
        assert torch.equal(seen.pop(), r0)
        assert torch.equal(r, x0 + r0)
        assert torch.equal(x, _fused_add_rmsnorm(x0, r0, w))


def test_output_written_into_an_element_of_a_tuple_argument():
    # append_paged_kv_cache's outputs go back through the inputs they update (`-> k_cache`,
    # with `k_cache <- paged_kv_cache[0]`): a routed call fills the caller's cache tuple in
    # place and returns None, as FlashInfer's does.
    from fibgen_kernels.append_paged_kv_cache import append_paged_kv_cache as dispatcher

    def solution(append_key, append_value, batch_indices, positions, k_cache, v_cache, **_):
        pages = batch_indices.long() * 2 + positions.long()  # kv_indices below: 0..3 in order
        k_out, v_out = k_cache.clone(), v_cache.clone()
        k_out[pages, 0], v_out[pages, 0] = append_key, append_value
        return k_out, v_out

    k = torch.randn(3, 8, 128, dtype=torch.bfloat16)
    v = torch.randn(3, 8, 128, dtype=torch.bfloat16)
    cache = (torch.zeros(4, 1, 8, 128, dtype=torch.bfloat16),) + (
        torch.zeros(4, 1, 8, 128, dtype=torch.bfloat16),
    )
    args = (
        torch.tensor([0, 1, 1], dtype=torch.int32),  # batch_indices
        torch.tensor([0, 0, 1], dtype=torch.int32),  # positions
        cache,
        torch.arange(4, dtype=torch.int32),  # kv_indices
        torch.tensor([0, 2, 4], dtype=torch.int32),  # kv_indptr
        torch.tensor([1, 1], dtype=torch.int32),  # kv_last_page_len
    )
    with rt.enable_apply({"append_paged_kv_cache_kv8_d128_ps1": solution}):
        assert dispatcher(k, v, *args) is None
    for written, appended in zip(cache, (k, v)):
        assert torch.equal(written[[0, 2, 3], 0], appended)
        assert not written[1].any()


def _picky(hidden_states, weight):
    # Serves at most two rows; hands larger calls back.
    if hidden_states.shape[0] > 2:
        raise rt.Decline("more than two rows")
    return hidden_states * 2


def test_declining_solution_hands_the_call_to_the_original():
    x1, x3, w = torch.randn(1, 4096), torch.randn(3, 4096), torch.randn(4096)
    with rt.enable_apply({"rmsnorm_h4096": _picky}):
        assert torch.equal(fake_flashinfer.rmsnorm(x1, w), x1 * 2)
        out = torch.empty(3, 4096)
        # The original gets the call's own arguments, the caller's buffer included.
        assert fake_flashinfer.rmsnorm(x3, w, out=out) is out
        assert torch.allclose(out, ORIGINAL_RMSNORM(x3, w))
    assert CALLS == ["rmsnorm", "rmsnorm"]  # the declined call, then the check above
    counts = rt.stats()[RMS]
    assert (counts["hit"], counts["fallback_declined"], counts["error"]) == (1, 1, 0)


@pytest.mark.slow
def test_declining_without_an_original_runs_the_reference_as_a_miss_does():
    def picky(x, bias):
        raise rt.Decline("never")

    x, b = torch.randn(2, 8), torch.randn(8)
    with rt.enable_apply({"add_bias_h8": picky}):
        assert torch.equal(add_bias.add_bias(x, b), x + b)
        # An undeclared size has no solution: the same fallback.
        assert torch.equal(add_bias.add_bias(x[:, :4], b[:4]), x[:, :4] + b[:4])
    counts = rt.stats()["fake_kernels.add_bias"]
    assert (counts["hit"], counts["fallback_declined"], counts["fallback_no_candidate"]) == (
        0,
        1,
        1,
    )
    with rt.enable_apply({"add_bias_h8": picky}, strict=True):
        with pytest.raises(rt.FallbackError, match="declined a call of 'add_bias_h8'.*never"):
            add_bias.add_bias(x, b)


def test_declined_call_by_definition_name_runs_the_reference():
    api = next(a for a in apply_module.STATE.apis if a.label == RMS)
    x, w = torch.randn(3, 4096), torch.randn(4096)
    with rt.enable_apply({"rmsnorm_h4096": _picky}):
        result = api.call_definition("rmsnorm_h4096", {"hidden_states": x, "weight": w})
    assert torch.allclose(result, ORIGINAL_RMSNORM(x, w), atol=1e-5)
    assert rt.stats()[RMS]["fallback_declined"] == 1


def test_a_miss_on_a_name_no_instance_declares_runs_the_reference_with_its_parameters(
    tmp_path,
):
    # The family reference of a name its rule spells needs the parameters that are not axes
    # (top_k): they come from the call's key, and from the family's defaults.
    from _shared import generated_package

    source = """
family topk_sum {
  op_type demo
  params {
    top_k k
    SCALE = 2.0
  }
  axes {
    n : var
    h : const h
  }
  inputs {
    x     : float32[n, h]
    top_k : int32 scalar
  }
  outputs {
    y : float32[n]
  }
  reference \"\"\"
    def run(x, top_k):
        return x.topk(top_k, dim=-1).values.sum(-1) * SCALE
  \"\"\"
  instances {
    k=2 h=8
  }
}
"""
    (module,) = generated_package(
        tmp_path, source, "demo_kernels_params", "demo_kernels_params.topk_sum"
    )
    topk_sum = module.topk_sum
    x = torch.randn(3, 16)
    with rt.enable_apply({}):
        # topk_sum_k3_h16: no instance declares it, no original API: the reference runs.
        assert torch.allclose(topk_sum(x, 3), x.topk(3, dim=-1).values.sum(-1) * 2.0)


_NORM_WITHOUT_ORIGINAL = """
family scalenorm {
  op_type rmsnorm
  description "Rows scaled by the inverse of their RMS, with an epsilon."
  api not_installed_anywhere.scalenorm(input, eps=1e-6)
  rules {
    eps == EPS
  }
  params {
    EPS = 1e-06 "Epsilon."
  }
  axes {
    n : var
    h : const h
  }
  inputs {
    x : float32[n, h] <- input
  }
  outputs {
    y : float32[n, h]
  }
  reference \"\"\"
    import torch

    def run(x):
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS)
  \"\"\"
  instances {
    h=8
    h=16 EPS=0.5
  }
}
"""


def test_without_an_original_a_call_its_rules_refuse_raises_instead_of_running_the_reference(
    tmp_path,
):
    # The reference computes the definition: with another eps it would be a wrong result.
    from _shared import generated_package

    (module,) = generated_package(
        tmp_path,
        _NORM_WITHOUT_ORIGINAL,
        "demo_kernels_no_original",
        "demo_kernels_no_original.scalenorm",
    )
    scalenorm = module.scalenorm
    x8, x16 = torch.randn(3, 8), torch.randn(3, 16)
    expected = x16 * torch.rsqrt(x16.square().mean(-1, keepdim=True) + 0.5)
    # Apply off and on: the call with the definition's eps gets the reference, counted as a
    # miss; the call with another eps is refused with the rule and the value.
    assert torch.allclose(scalenorm(x16, 0.5), expected)
    with pytest.raises(rt.FallbackError, match=r"scalenorm_h8 cannot be served: .*eps.*0\.5"):
        scalenorm(x8, 0.5)
    with rt.enable_apply({}):
        assert torch.allclose(scalenorm(x16, 0.5), expected)
        with pytest.raises(rt.FallbackError, match=r"eps \(eps=0\.5\), and there is no original"):
            scalenorm(x8, 0.5)
        counts = rt.stats()["not_installed_anywhere.scalenorm"]
    assert counts["fallback_no_candidate"] == 1 and counts["fallback_guard"] == 1
    assert counts["rules"] == {"eps": 1}


@pytest.mark.slow
@pytest.mark.parametrize(
    "make, got",
    [
        (lambda x: torch.zeros(2, 3), "a float32 tensor of shape [2, 3] on cpu"),
        (lambda x: x.double(), "a float64 tensor of shape [1, 4096] on cpu"),
        (lambda x: None, "None"),
        (lambda x: (x, x), "a tuple of 2"),
        # On another device: meta, which get_device() alone took for the CPU (-1 for both).
        (
            lambda x: torch.empty_like(x, device="meta"),
            "a float32 tensor of shape [1, 4096] on meta",
        ),
    ],
)
def test_a_result_unlike_the_definitions_is_an_error_that_says_what_was_expected(make, got):
    def solution(hidden_states, weight):
        return make(hidden_states)

    x, w = torch.randn(1, 4096), torch.randn(4096)
    with rt.enable_apply({"rmsnorm_h4096": solution}, strict=True):
        with pytest.raises(rt.SolutionError) as raised:
            rmsnorm.rmsnorm(x, w)
    message = str(raised.value)
    assert f"returned {got}" in message and "for definition 'rmsnorm_h4096'" in message
    assert "expected a float32 tensor of shape [1, 4096] on cpu" in message
    # Not strict: the call falls back to the original, with or without the caller's buffer,
    # and each is counted as an error, none as a hit.
    out = torch.empty_like(x)
    with rt.enable_apply({"rmsnorm_h4096": solution}):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plain = rmsnorm.rmsnorm(x, w)
            filled = rmsnorm.rmsnorm(x, w, out=out)
        counts = rt.stats()[RMS]
    assert torch.equal(plain, ORIGINAL_RMSNORM(x, w))
    assert filled is out and torch.equal(out, plain)
    assert counts["error"] == 2 and counts["hit"] == 0


def test_a_mistyped_name_is_warned_about_at_enable_with_the_closest_names(monkeypatch):
    _no_handwritten_routes(monkeypatch)
    with pytest.warns(RuntimeWarning) as caught:
        rt.enable_apply({"rmsnorm_h4069": _doubling}, patch=False)
    (warning,) = [w for w in caught if "enable_apply" in str(w.message)]
    assert str(warning.message) == (
        "fibgen: enable_apply: no imported dispatcher and no definition of fibgen's catalogue "
        "is called 'rmsnorm_h4069' (did you mean 'rmsnorm_h4096', 'rmsnorm_h8192', "
        "'rmsnorm_h7168'?); a call reaches its solution only if some dispatcher routes that "
        "name"
    )
    assert warning.filename == __file__  # the caller's line, not fibgen's


def test_known_names_enable_without_a_warning_or_a_look_at_the_catalogue(monkeypatch):
    def listing_the_catalogue():
        raise AssertionError("the catalogue is listed only for a name nothing else knows")

    monkeypatch.setattr(apply_module, "_catalogue_names", listing_the_catalogue)

    @rt.apply("handwritten_only_name")
    def handwritten(x):
        return x

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # A dispatcher's name, and a name hand-written code routes.
        rt.enable_apply(
            {"rmsnorm_h4096": _doubling, "handwritten_only_name": handwritten}, patch=False
        )


def test_a_catalogue_name_without_an_imported_dispatcher_is_known():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # A callable of the definition's own parameters: where another test imported the
        # dispatcher, enable checks the callable against it.
        rt.enable_apply({"gemm_n128_k2048": lambda A, B: A @ B.T}, patch=False, packages=[])


def test_no_name_is_called_unknown_while_a_resolver_routes_hand_written_code(monkeypatch):
    _no_handwritten_routes(monkeypatch)

    @rt.apply(lambda x: f"resolved_{x.shape[0]}")
    def handwritten(x):
        return x

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rt.enable_apply({"resolved_3": lambda x: x}, patch=False)
