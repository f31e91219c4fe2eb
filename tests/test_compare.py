"""flashinfer-bench's correctness rule, as fibgen.runtime.compare implements it."""

import math

import pytest
import torch

from fibgen.runtime.compare import compare, compare_outputs, default_tolerance


def test_identical_tensors_match():
    x = torch.randn(4, 8)
    r = compare(x, x.clone())
    assert r.ok and r.max_abs_err == 0 and r.matched_ratio == 1.0 and r.num_mismatched == 0


def test_element_fails_only_when_both_errors_exceed():
    expected = torch.tensor([100.0, 0.001], dtype=torch.float32)
    # 100 -> 100.5: abs 0.5 > atol but rel 0.005 <= rtol; 0.001 -> 0.0015: rel 0.5 but abs small.
    actual = torch.tensor([100.5, 0.0015])
    assert compare(actual, expected, atol=1e-2, rtol=1e-2).ok
    r = compare(torch.tensor([101.5, 0.001]), expected, atol=1e-2, rtol=1e-2)
    assert not r.ok and r.num_mismatched == 1 and r.matched_ratio == 0.5
    assert math.isclose(r.max_abs_err, 1.5)
    assert "1 of 2 elements" in r.reason


def test_matched_ratio_allows_some_failures():
    expected = torch.zeros(10)
    actual = expected.clone()
    actual[0] = 1.0
    assert not compare(actual, expected).ok
    assert compare(actual, expected, matched=0.9).ok
    assert not compare(actual, expected, matched=0.95).ok


def test_default_tolerances_per_dtype():
    assert default_tolerance(torch.bfloat16) == (1e-2, 1e-2)
    assert default_tolerance(torch.float16) == (1e-2, 1e-2)
    assert default_tolerance(torch.float32)[0] < 1e-2
    assert default_tolerance(torch.int32) == (0.0, 0.0)
    assert default_tolerance("float8_e4m3fn")[0] > 1e-2
    e = torch.ones(3, dtype=torch.bfloat16)
    assert compare(e + 0.0078125, e).ok  # one bf16 step at 1.0 is within 1e-2
    e32 = torch.ones(3)
    assert not compare(e32 + 1e-3, e32).ok


def test_integers_are_exact():
    e = torch.tensor([1, 2, 3], dtype=torch.int32)
    assert compare(e.clone(), e).ok
    r = compare(torch.tensor([1, 2, 4], dtype=torch.int32), e, atol=10, rtol=10)
    assert not r.ok and r.max_abs_err == 1


def test_nan_and_inf():
    e = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0])
    assert compare(e.clone(), e).ok
    r = compare(torch.tensor([0.0, float("inf"), -float("inf"), 1.0]), e)
    assert not r.ok and r.num_mismatched == 1 and r.max_abs_err == float("inf")
    r = compare(torch.tensor([float("nan"), -float("inf"), -float("inf"), 1.0]), e)
    assert not r.ok and r.num_mismatched == 1
    r = compare(torch.tensor([float("nan"), float("inf"), -float("inf"), float("nan")]), e)
    assert not r.ok and r.num_mismatched == 1


def test_shape_and_dtype_mismatch_fail_with_reason():
    e = torch.zeros(2, 3)
    r = compare(torch.zeros(3, 2), e)
    assert not r.ok and "shape [3, 2] != expected [2, 3]" in r.reason
    r = compare(torch.zeros(2, 3, dtype=torch.float16), e)
    assert not r.ok and "dtype" in r.reason
    assert compare(torch.zeros(2, 3, dtype=torch.float16), e, check_dtype=False).ok


def test_empty_and_low_bit():
    assert compare(torch.zeros(0, 4), torch.zeros(0, 4)).ok
    e = torch.tensor([1.0, 2.0]).to(torch.float8_e4m3fn)
    assert compare(e.clone(), e).ok
    if hasattr(torch, "float4_e2m1fn_x2"):
        b = torch.tensor([0x22, 0x13], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
        assert compare(b.clone(), b).ok
        other = torch.tensor([0x22, 0x14], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
        assert not compare(other, b).ok


def test_compare_outputs_by_name():
    out = (torch.ones(2), torch.zeros(2))
    res = compare_outputs(out, (torch.ones(2), torch.ones(2)), ["output", "lse"])
    assert res["output"].ok and not res["lse"].ok
    assert "FAILED" in str(res["lse"]) and "max_abs_err" in str(res["output"])
    with pytest.raises(ValueError, match="got 1 outputs, expected 2"):
        compare_outputs(torch.ones(2), out)
