"""The API call of a definition's inputs (Note [api calls] in fibgen/runtime/inputs/api_calls.py).

Bench times what apply delivers: the call an engine makes, through the generated dispatcher.
Each catalogue dispatcher carries a recipe for making that call from a workload's inputs; the
recipe is checked by routing the call to a probe, which must receive exactly those inputs.
Here, against the real FlashInfer 0.7.2 (its norm and activation kernels, and its paged decode
wrapper, computed in torch on this CPU: ``_flashinfer_cpu``).
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from _shared import require_module

flashinfer = require_module("flashinfer", "the real FlashInfer's APIs are called")
import _flashinfer_cpu as cpu  # noqa: E402

import fibgen.runtime as rt  # noqa: E402
from fibgen.paths import builtin_definition_file  # noqa: E402
from fibgen.runtime.inputs import api_calls  # noqa: E402
from fibgen.runtime.inputs.make import InputSpec, generate_inputs_with_axes  # noqa: E402
from fibgen.runtime.solutions.loading import allocate_outputs  # noqa: E402
from fibgen.runtime.checking.testing import compile_reference  # noqa: E402


@pytest.fixture(autouse=True)
def _off():
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.disable_apply()


def _case(name: str, **axes: int):
    path = builtin_definition_file(name)
    definition = json.loads(path.read_text(encoding="utf-8"))
    sidecar = path.with_suffix(".fibgen")
    hints = (
        json.loads(sidecar.read_text(encoding="utf-8")).get("hints", {}) if sidecar.exists() else {}
    )
    inputs, _ = generate_inputs_with_axes(
        InputSpec.from_definition_json(definition, hints), axes, seed=0
    )
    return definition, inputs, allocate_outputs(definition, inputs)


# Function APIs whose call the recipe makes and the probe confirms, one definition each.
FUNCTION_CASES = [
    ("rmsnorm_h4096", {"batch_size": 3}),
    ("fused_add_rmsnorm_h4096", {"batch_size": 3}),
    ("gemma_rmsnorm_h2304", {"batch_size": 3}),
    ("layernorm_h1024", {"batch_size": 3}),
    ("silu_and_mul_h14336_bf16", {"num_tokens": 3}),
    ("gelu_and_mul_h4096_fp16", {"num_tokens": 3}),
    ("merge_state_h32_d128", {"seq_len": 3}),
    ("top_k_sampling_from_probs_v128256", {"batch_size": 2}),
]


@pytest.mark.parametrize("name,axes", FUNCTION_CASES, ids=[c[0] for c in FUNCTION_CASES])
def test_the_recipe_makes_the_call_the_dispatcher_maps_back_to_the_inputs(name, axes):
    definition, inputs, outputs = _case(name, **axes)
    api = api_calls.api_for(name, definition)
    assert api is not None and api.call is not None, api and api.call_problem
    call = api_calls.build(api, name, definition, inputs, outputs, "cpu")
    call.check(inputs)  # raises CallUnavailable unless the probe saw exactly these inputs


def test_the_engine_call_leaves_optional_buffers_to_the_dispatcher():
    definition, inputs, outputs = _case("rmsnorm_h4096", batch_size=2)
    api = api_calls.api_for("rmsnorm_h4096", definition)
    call = api_calls.build(api, "rmsnorm_h4096", definition, inputs, outputs, "cpu")
    _, engine = call.engine
    _, full = call.with_buffers
    # flashinfer.norm.rmsnorm(input, weight, eps, out=None): an engine passes eps, not out.
    assert engine == {"input": inputs["hidden_states"], "weight": inputs["weight"], "eps": 1e-5}
    assert full["out"] is outputs["output"]


def test_the_original_and_the_routed_call_compute_the_reference(monkeypatch):
    cpu.norm_kernels_on_cpu(monkeypatch)
    definition, inputs, outputs = _case("rmsnorm_h4096", batch_size=4)
    expected = compile_reference(definition)(**inputs)
    api = api_calls.api_for("rmsnorm_h4096", definition)
    call = api_calls.build(api, "rmsnorm_h4096", definition, inputs, outputs, "cpu")
    assert torch.allclose(call.original(), expected, atol=1e-2, rtol=1e-2)

    def solution(hidden_states, weight, output):
        output.copy_(compile_reference(definition)(hidden_states, weight))

    with rt.enable_apply({"rmsnorm_h4096": solution}):
        routed = call.routed()
        assert rt.stats()[api.label]["hit"] == 1
    assert torch.equal(routed, expected)


def test_a_wrapper_is_constructed_planned_and_its_plan_captured(monkeypatch):
    cpu.decode_wrapper_on_cpu(monkeypatch)
    name = "gqa_paged_decode_h32_kv8_d128_ps64"
    definition, inputs, outputs = _case(name, batch_size=3, num_pages=64)
    api = api_calls.api_for(name, definition)
    call = api_calls.build(api, name, definition, inputs, outputs, "cpu")
    assert call.instance is not None
    call.check(inputs)
    expected = compile_reference(definition)(**inputs)
    call.original(buffers=True)
    assert torch.allclose(outputs["output"].float(), expected[0].float(), atol=2e-2, rtol=2e-2)


def test_a_wrong_recipe_is_caught_by_the_check(monkeypatch):
    definition, inputs, outputs = _case("rmsnorm_h4096", batch_size=2)
    api = api_calls.api_for("rmsnorm_h4096", definition)
    # The weight passed as the input and the other way round: both are tensors the
    # dispatcher accepts shapes of only if... here it refuses the rank; either way no probe.
    swapped = tuple(
        (p, how, {"hidden_states": "weight", "weight": "hidden_states"}.get(arg, arg))
        for p, how, arg in api.call
    )
    monkeypatch.setattr(api, "call", swapped)
    call = api_calls.build(api, "rmsnorm_h4096", definition, inputs, outputs, "cpu")
    with pytest.raises(api_calls.CallUnavailable, match="does not route|another value"):
        call.check(inputs)


def test_a_family_without_an_inverse_says_why():
    # The full-pages decode family reads no last_page_len: the plan's is all page_size.
    api = api_calls.api_for("gqa_paged_decode_h32_kv8_d128_ps1")
    assert api.call is None
    assert "last_page_len" in api.call_problem
    definition, inputs, outputs = {}, {}, {}
    with pytest.raises(api_calls.CallUnavailable, match="last_page_len"):
        api_calls.build(
            api, "gqa_paged_decode_h32_kv8_d128_ps1", definition, inputs, outputs, "cpu"
        )
