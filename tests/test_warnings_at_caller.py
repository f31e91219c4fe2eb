"""The runtime's warnings point at the program's line (Note [warnings at the caller] in
fibgen/runtime/caller.py), whichever path of fibgen's the call took: a generated dispatcher,
the ``apply`` decorator or function form, tracing's wrapped routes, enable_apply itself.

What is said once is said once per process, so each test here uses names no other test uses.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import fibgen.runtime as rt
from fake_flashinfer.calls import clean_apply  # noqa: F401  (autouse)
from fake_flashinfer.catalogue import generated_package

generated_package()

from fake_kernels import rmsnorm  # noqa: E402  (generated just above)

HERE = __file__.removesuffix("c")  # a .pyc path names its source


def _sites(caught: list[warnings.WarningMessage], text: str) -> list[str]:
    return [w.filename for w in caught if text in str(w.message)]


def test_a_misspelt_hand_written_name_is_said_at_the_callers_line():
    x = torch.ones(2, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with rt.enable_apply({"rmsnorm_h4096": lambda hidden_states, weight: hidden_states}):
            rt.apply("rmsnrom_h4096_warn_site", (x,), fallback=lambda a: a)
    assert _sites(caught, "rmsnrom_h4096_warn_site") == [HERE]


def test_a_failing_solution_through_a_dispatcher_is_said_at_the_callers_line():
    def broken(hidden_states, weight):
        raise RuntimeError("warn-site failure")

    x, w = torch.randn(3, 1024), torch.randn(1024)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with rt.enable_apply({"rmsnorm_h1024": broken}):
            rmsnorm.rmsnorm(x, w)
    sites = _sites(caught, "warn-site failure")
    assert sites == [HERE], [(w.filename, str(w.message)) for w in caught]


def test_what_tracing_cannot_record_is_said_at_the_callers_line(tmp_path):
    @rt.apply("warn_site_layer_without_definition")
    def layer(x):
        return x

    rt.enable_tracing(tmp_path, dump="none")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            layer(torch.ones(1))
    finally:
        rt.disable_tracing()
    assert _sites(caught, "warn_site_layer_without_definition is not recorded") == [HERE]


def test_enable_apply_of_nothing_is_said_at_the_callers_line():
    with pytest.warns(RuntimeWarning, match="no solution given") as caught:
        rt.enable_apply({})
    rt.disable_apply()
    assert _sites(list(caught), "no solution given") == [HERE]


@pytest.mark.slow
def test_a_failing_solution_through_the_real_patched_api_is_said_at_the_callers_line():
    # FlashInfer's real rmsnorm, patched while apply is on: the patching's frames and the
    # generated dispatcher's are passed over.
    from _shared import require_module

    require_module("flashinfer", "the real FlashInfer's patched API")
    import flashinfer.norm

    def broken(hidden_states, weight):
        raise RuntimeError("warn-site real failure")

    x, w = torch.randn(2, 4096, dtype=torch.bfloat16), torch.randn(4096, dtype=torch.bfloat16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with rt.enable_apply({"rmsnorm_h4096": broken}):
            with pytest.raises(Exception):  # the fallback: FlashInfer's own kernel, on a CPU
                flashinfer.norm.rmsnorm(x, w, 1e-5)
    assert _sites(caught, "warn-site real failure") == [HERE]
