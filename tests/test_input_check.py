"""A routed solution that writes its inputs is caught on its first call, and its inputs are
written back (Note [first-call input check] in fibgen/runtime/checking/input_check.py)."""

from __future__ import annotations


import pytest
import torch

import fake_flashinfer
import fibgen.runtime as rt
from fake_flashinfer import CALLS
from fake_flashinfer.calls import clean_apply  # noqa: F401  (autouse)
from fake_flashinfer.catalogue import generated_package
from fibgen.runtime.checking import input_check

generated_package()

from fake_kernels import rmsnorm  # noqa: E402  (generated just above)

RMS = "fake_flashinfer.norm.rmsnorm"
ORIGINAL = fake_flashinfer.norm.rmsnorm


def _inputs():
    torch.manual_seed(0)
    return torch.randn(3, 4096), torch.randn(4096)


def _writes_x(hidden_states, weight):
    hidden_states.mul_(2)
    return hidden_states * weight


def _writes_w(hidden_states, weight, output):
    weight.zero_()
    output.copy_(hidden_states)


@pytest.mark.parametrize("solution,written", [(_writes_x, "hidden_states"), (_writes_w, "weight")])
def test_a_solution_that_writes_an_input_is_caught_once_and_its_calls_fall_back(solution, written):
    x, w = _inputs()
    x0, w0 = x.clone(), w.clone()
    how = rf"'{written}' \(\d+ of \d+ elements differ\)"
    with pytest.warns(RuntimeWarning, match=rf"changed its input\(s\) {how}: a solution may"):
        with rt.enable_apply({"rmsnorm_h4096": solution}):
            first = fake_flashinfer.norm.rmsnorm(x, w)
            second = fake_flashinfer.norm.rmsnorm(x, w)
            counts = rt.stats()[RMS]
    # The caller's tensors are as they were, and both calls got what the original computes.
    assert torch.equal(x, x0) and torch.equal(w, w0)
    expected = ORIGINAL(x0, w0)
    assert torch.equal(first, expected) and torch.equal(second, expected)
    assert CALLS == ["rmsnorm"] * 3  # two fallbacks, and the expected value above
    assert counts["hit"] == 0 and counts["error"] == 2


@pytest.mark.slow
def test_strict_mode_raises_with_the_inputs_written_back():
    x, w = _inputs()
    x0 = x.clone()
    with rt.enable_apply({"rmsnorm_h4096": _writes_x}, strict=True):
        with pytest.raises(rt.SolutionError, match=r"input\(s\) 'hidden_states' \(12288 of 12288"):
            rmsnorm.rmsnorm(x, w)
    assert torch.equal(x, x0)


def test_a_solution_that_leaves_its_inputs_is_checked_on_its_first_call_only(monkeypatch):
    copies = []
    real = input_check.snapshot
    monkeypatch.setattr(input_check, "snapshot", lambda *a: copies.append(1) or real(*a))
    x, w = _inputs()
    with rt.enable_apply({"rmsnorm_h4096": lambda hidden_states, weight: hidden_states * w}):
        for _ in range(3):
            assert torch.equal(fake_flashinfer.norm.rmsnorm(x, w), x * w)
        counts = rt.stats()[RMS]
    assert copies == [1] and counts["hit"] == 3 and counts["error"] == 0


def test_an_input_that_is_also_the_output_buffer_may_be_written():
    # A destination-passing call handed its input as `out` (FlashInfer allows it).
    def dps(hidden_states, weight, output):
        output.copy_(hidden_states * 3)

    x, w = _inputs()
    x0 = x.clone()
    with rt.enable_apply({"rmsnorm_h4096": dps}):
        assert rmsnorm.rmsnorm(x, w, out=x) is x
        counts = rt.stats()[RMS]
    assert torch.equal(x, x0 * 3) and counts["hit"] == 1 and counts["error"] == 0


def test_a_nan_left_in_place_is_no_change():
    x, w = _inputs()
    x[0, 0] = float("nan")
    with rt.enable_apply({"rmsnorm_h4096": lambda hidden_states, weight: hidden_states + 0}):
        rmsnorm.rmsnorm(x, w)
        assert rt.stats()[RMS]["hit"] == 1 and rt.stats()[RMS]["error"] == 0


def test_inputs_above_the_budget_are_not_copied(monkeypatch):
    monkeypatch.setattr(input_check, "BUDGET", 4096 * 4)  # room for `weight` only
    x, w = _inputs()
    copies = input_check.snapshot(
        {"hidden_states": x, "weight": w}, ("hidden_states", "weight"), ()
    )
    assert list(copies) == ["weight"]


def test_the_check_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("FIBGEN_INPUT_CHECK", "0")
    x, w = _inputs()
    with rt.enable_apply({"rmsnorm_h4096": _writes_x}):
        rmsnorm.rmsnorm(x, w)
        assert rt.stats()[RMS]["hit"] == 1


@pytest.mark.slow
def test_with_tracing_on_a_failing_route_still_falls_back(tmp_path):
    # Tracing wraps the routes it records; a solution's error must still fall back.
    def broken(hidden_states, weight):
        raise RuntimeError("kernel exploded")

    x, w = _inputs()
    rt.enable_tracing(tmp_path / "ds")
    try:
        with pytest.warns(RuntimeWarning, match="kernel exploded"):
            with rt.enable_apply({"rmsnorm_h4096": broken}):
                assert torch.equal(rmsnorm.rmsnorm(x, w), ORIGINAL(x, w))
                assert rt.stats()[RMS]["error"] == 1
    finally:
        rt.disable_tracing()


def test_fp4_and_fp8_inputs_compare_by_their_bytes():
    # FP4 has no elementwise equality on the CPU: a solution given FP4 weights was an error.
    packed = torch.arange(16, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    fp8 = torch.linspace(-2, 2, 8).to(torch.float8_e4m3fn)
    kwargs = {"w": packed, "s": fp8}
    copies = input_check.snapshot(kwargs, ("w", "s"), ())
    assert input_check.changed(kwargs, copies) == {}
    packed.view(torch.uint8)[3] = 200
    fp8.view(torch.uint8)[0] = 0
    assert input_check.changed(kwargs, copies) == {
        "w": "'w' (1 of 16 elements differ)",
        "s": "'s' (1 of 8 elements differ)",
    }
    assert packed.view(torch.uint8)[3] == 3 and fp8.view(torch.uint8)[0] != 0  # written back


def test_an_expanded_input_compares_whatever_its_strides():
    # A weight broadcast with expand() has stride 0: its bytes are read through a copy.
    w = torch.ones(1).expand(4096)
    kwargs = {"w": w}
    assert input_check.changed(kwargs, input_check.snapshot(kwargs, ("w",), ())) == {}
