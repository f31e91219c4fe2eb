"""The paged MQA logits families of ``attention_dsa.fidef`` against the real FlashInfer.

FlashInfer 0.7.2.post1 is installed; its kernels need a Blackwell GPU, so its functions are
never run here. The real function is replaced by a recorder with its signature before apply is
enabled, and each check calls the patched API: a call with FlashInfer's defaults is routed with
the logits as wide as its ``max_seq_len`` argument (a `var scalar` axis), each ruled parameter
at another value is refused with its rule counted, and the reference agrees with the reference
of FlashInfer's own trace template.
"""

from __future__ import annotations

import functools
import inspect

import pytest
import torch
from _shared import catalogue_module, require_module

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import _mqa_logits_calls as calls  # noqa: E402
import _routable_calls as routable  # noqa: E402
import fibgen.runtime as rt  # noqa: E402
from fibgen.runtime.routing import patching  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning")

FP8 = "flashinfer.attn_scores.attn_scores.fp8_paged_mqa_logits"


@functools.cache
def _catalogue():
    return routable.Catalogue(catalogue_module())


@functools.cache
def _reference(name: str):
    namespace: dict = {}
    exec(_catalogue().defs[name].reference, namespace)
    return namespace["run"]


@pytest.fixture(autouse=True)
def _off():
    yield
    rt.disable_apply()


def _route(monkeypatch, path: str, name: str, args: tuple, kwargs: dict):
    """Call the patched API with a solution for ``name`` that runs the reference; returns
    (result, the inputs the solution saw, the calls FlashInfer's function got, counts)."""
    owner, attr = patching._locate(path)
    real = getattr(owner, attr)
    originals: list = []

    def original(*a, **k):
        originals.append(inspect.signature(real).bind(*a, **k).arguments)
        return "flashinfer"

    original.__signature__ = inspect.signature(real)  # type: ignore[attr-defined]
    monkeypatch.setattr(owner, attr, original)
    seen: list = []

    def solution(**inputs):
        seen.append(inputs)
        return _reference(name)(**inputs)

    rt.enable_apply({name: solution})
    result = getattr(owner, attr)(*args, **kwargs)
    counts = rt.stats()[path]
    rt.disable_apply()
    return result, seen, originals, counts


def test_fp8_logits_are_as_wide_as_max_seq_len(monkeypatch):
    # 100 columns: not a multiple of the 64-token block, and wider than every seq_lens entry.
    args, x, _ = calls.fp8_case(_catalogue(), max_seq_len=100)
    result, seen, originals, counts = _route(monkeypatch, FP8, calls.FP8_NAME, args, {})
    assert counts["hit"] == 1 and not originals, counts
    (inputs,) = seen
    assert inputs["max_seq_len"] == 100 and inputs["kv_fused"].dtype == torch.int8
    assert result.shape == (4, 100) and result.dtype == torch.float32
    # Row b * next_n + t sees positions up to seq_lens[b] - next_n + t, and -inf after.
    for row in range(4):
        limit = int(x["seq_lens"][row // 2]) - 2 + row % 2
        assert torch.isfinite(result[row, : limit + 1]).all()
        assert torch.isneginf(result[row, limit + 1 :]).all()


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("output_dtype", torch.float16),
        ("epi_dtype", torch.float16),
        ("acc_dtype", torch.float16),
        ("out", torch.zeros(4, 128)),
    ],
)
def test_fp8_ruled_parameters_are_refused_at_other_values(monkeypatch, param, value):
    args, _, _ = calls.fp8_case(_catalogue())
    result, seen, originals, counts = _route(monkeypatch, FP8, calls.FP8_NAME, args, {param: value})
    assert counts["hit"] == 0 and not seen and counts["rules"] == {param: 1}, counts
    assert result == "flashinfer" and len(originals) == 1


def test_fp8_reference_agrees_with_flashinfers_template():
    from flashinfer.trace.templates.attn_scores import _fp8_paged_mqa_logits_reference

    args, x, _ = calls.fp8_case(_catalogue(), seed=3, max_seq_len=130)
    ours = _reference(calls.FP8_NAME)(**x)
    theirs = _fp8_paged_mqa_logits_reference(*args)
    assert ours.shape == theirs.shape == (4, 130)
    assert torch.equal(torch.isneginf(ours), torch.isneginf(theirs))
    finite = torch.isfinite(theirs)
    assert finite.any()
    torch.testing.assert_close(ours[finite], theirs[finite], rtol=1e-5, atol=1e-4)
