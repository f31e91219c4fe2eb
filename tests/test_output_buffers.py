"""The caller's output buffers (``out=``) through generated dispatchers: Note [output buffers]
in ``fibgen/codegen/python/dispatch/rules.py``.

A buffer of the definition's dtype, shape and device is handed to a destination-passing
solution as it is; any other goes, with its call, to FlashInfer's own function, counted under
``tensor:<output>`` and said with what is wrong with it. Against the real FlashInfer package,
its norm kernels computing in torch on the CPU (``_flashinfer_cpu``).
"""

from __future__ import annotations

import re
import textwrap

import pytest
import torch

import _flashinfer_cpu as cpu
from _shared import generated_package
import fibgen.runtime as rt
import flashinfer

pytest.importorskip("fibgen_kernels.rmsnorm")

RMS = "flashinfer.norm.rmsnorm"


def _bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).to(torch.bfloat16)


def _dps(seen: list):
    def solution(hidden_states, weight, output):
        seen.append(output)
        output.copy_(cpu.rms(hidden_states, weight, 1e-5))

    return solution


def test_a_buffer_of_the_definitions_output_is_the_one_the_solution_writes(monkeypatch):
    cpu.norm_kernels_on_cpu(monkeypatch)
    x, w, seen = _bf16(4, 4096), _bf16(4096), []
    out = torch.empty_like(x)
    with rt.enable_apply({"rmsnorm_h4096": _dps(seen)}):
        assert flashinfer.norm.rmsnorm(x, w, 1e-5, out=out) is out
    assert len(seen) == 1 and seen[0] is out
    assert torch.equal(out, cpu.rms(x, w, 1e-5))
    assert rt.stats()[RMS]["hit"] == 1


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (
            lambda: torch.empty(4, 4096),
            "the out= buffer is float32, the definition's is bfloat16",
        ),
        (
            lambda: torch.empty(2, 4096, dtype=torch.bfloat16),
            "the out= buffer has size 2 along axis batch_size (dim 0), expected 4 as in "
            "hidden_states (dim 0)",
        ),
        (
            lambda: torch.empty(4, 4, 4096, dtype=torch.bfloat16),
            "the out= buffer has 3 dims, the definition's has 2 [batch_size, hidden_size]",
        ),
        (
            lambda: torch.empty(4, 4096, dtype=torch.bfloat16, device="meta"),
            "the out= buffer is on meta, the inputs are on cpu",
        ),
    ],
    ids=["dtype", "rows", "rank", "device"],
)
def test_a_buffer_that_is_not_the_definitions_output_goes_to_flashinfer(monkeypatch, make, said):
    cpu.norm_kernels_on_cpu(monkeypatch)
    x, w, seen = _bf16(4, 4096), _bf16(4096), []
    mine, theirs = make(), make()
    try:
        expected = flashinfer.norm.rmsnorm(x, w, 1e-5, out=theirs)  # apply off
    except RuntimeError as exc:
        expected = exc
    with rt.enable_apply({"rmsnorm_h4096": _dps(seen)}):
        if isinstance(expected, RuntimeError):
            with pytest.raises(RuntimeError, match=re.escape(str(expected))):
                flashinfer.norm.rmsnorm(x, w, 1e-5, out=mine)
        else:
            assert flashinfer.norm.rmsnorm(x, w, 1e-5, out=mine) is mine
            if mine.device.type != "meta":
                assert torch.equal(mine, theirs)
        counts = rt.stats()[RMS]
    assert not seen  # the solution never saw the buffer
    assert (counts["hit"], counts["fallback_guard"]) == (0, 1)
    assert counts["rules"] == {"tensor:output": 1}
    with rt.enable_apply({"rmsnorm_h4096": _dps(seen)}, strict=True):
        with pytest.raises(rt.FallbackError, match=re.escape(f"h4096 is not routed: {said} (")):
            flashinfer.norm.rmsnorm(x, w, 1e-5, out=make())
    assert not seen


def test_a_call_another_rule_refuses_is_counted_by_that_rule_not_by_its_buffer(monkeypatch):
    # Buffers are checked last: the reason a call is not the definition's comes first.
    cpu.norm_kernels_on_cpu(monkeypatch)
    x, w, seen = _bf16(4, 4096), _bf16(4096), []
    with rt.enable_apply({"rmsnorm_h4096": _dps(seen)}):
        flashinfer.norm.rmsnorm(x, w, 0.5, out=torch.empty(4, 4096))
        counts = rt.stats()[RMS]
    assert not seen and counts["rules"] == {"eps": 1}


def test_a_buffer_whose_sizes_come_from_derived_axes_is_checked_by_size():
    # concat_mla_k's k is [num_tokens, num_heads, nope_dim + rope_dim]: no input carries its
    # last axis, which is computed from the key; a buffer of four tokens for one is refused.
    import flashinfer.concat_ops

    k_nope, k_rope, seen = _bf16(1, 128, 128), _bf16(1, 1, 64), []

    def solution(k_nope, k_rope):
        seen.append(1)
        return torch.cat([k_nope, k_rope.expand(-1, k_nope.shape[1], -1)], dim=-1)

    name = "concat_mla_k_h128_nope128_rope64_d192"
    with rt.enable_apply({name: solution}, strict=True):
        with pytest.raises(rt.FallbackError, match=re.escape("the k= buffer has size 4 along")):
            flashinfer.concat_ops.concat_mla_k(
                torch.empty(4, 128, 192, dtype=torch.bfloat16), k_nope, k_rope
            )
        with pytest.raises(rt.FallbackError, match=re.escape("(bfloat16 [1, 128, 200])")):
            flashinfer.concat_ops.concat_mla_k(
                torch.empty(1, 128, 200, dtype=torch.bfloat16), k_nope, k_rope
            )
        k = torch.empty(1, 128, 192, dtype=torch.bfloat16)
        assert flashinfer.concat_ops.concat_mla_k(k, k_nope, k_rope) is None
    assert len(seen) == 1 and torch.equal(k, solution(k_nope, k_rope))


def test_a_buffer_of_a_dtype_the_key_gives_is_described_as_given():
    import flashinfer.activation

    x, seen = _bf16(4, 2 * 14336), []

    def solution(x, output):
        seen.append(output)

    with rt.enable_apply({"silu_and_mul_h14336_bf16": solution}, strict=True):
        with pytest.raises(
            rt.FallbackError,
            match=re.escape("the out= buffer (float16 [4, 14336]) is not the definition's output"),
        ):
            flashinfer.activation.silu_and_mul(x, out=torch.empty(4, 14336, dtype=torch.float16))
    assert not seen


def test_a_value_returning_solution_is_never_broadcast_into_a_larger_buffer(monkeypatch):
    # One row into a buffer of four: the dispatcher's `copy_` would repeat the row into all
    # four. The call is FlashInfer's, which does with that buffer what it does.
    cpu.norm_kernels_on_cpu(monkeypatch)
    x, w, seen = _bf16(1, 4096), _bf16(4096), []

    def solution(hidden_states, weight):
        seen.append(1)
        return cpu.rms(hidden_states, weight, 1e-5)

    mine, theirs = (torch.zeros(4, 4096, dtype=torch.bfloat16) for _ in range(2))
    flashinfer.norm.rmsnorm(x, w, 1e-5, out=theirs)  # apply off
    with rt.enable_apply({"rmsnorm_h4096": solution}):
        assert flashinfer.norm.rmsnorm(x, w, 1e-5, out=mine) is mine
        assert flashinfer.norm.rmsnorm(x, w, 1e-5) is not None  # no buffer: routed
        counts = rt.stats()[RMS]
    assert len(seen) == 1 and counts["hit"] == 1
    assert counts["rules"] == {"tensor:output": 1}
    assert torch.equal(mine, theirs)


def test_under_torch_compile_the_ops_dispatcher_checks_the_buffer(monkeypatch):
    cpu.norm_kernels_on_cpu(monkeypatch)
    x, w, seen = _bf16(4, 4096), _bf16(4096), []

    def norm(x, w, out):
        return flashinfer.norm.rmsnorm(x, w, 1e-5, out=out)

    compiled = torch.compile(norm, backend="aot_eager", fullgraph=True)
    good, bad = torch.empty_like(x), torch.empty(4, 4096)
    with rt.enable_apply({"rmsnorm_h4096": _dps(seen)}):
        compiled(x, w, good)
        compiled(x, w, bad)
        counts = rt.stats()[RMS]
    assert len(seen) == 1 and torch.equal(good, cpu.rms(x, w, 1e-5))
    assert torch.equal(bad, cpu.rms(x, w, 1e-5).float())  # FlashInfer's own wrote it
    assert counts["rules"] == {"tensor:output": 1}


_LAID_OUT = """
family pack_t {
  op_type demo
  description "Rows doubled; the API writes them transposed into its buffer."
  api bufdemo_api.pack_t(input, out=None)
  returns y
  rules {
    result y = y.t()
  }
  axes {
    n : var
    h : const h
  }
  inputs {
    x : float32[n, h] <- input
  }
  outputs {
    y : float32[n, h] -> out
  }
  reference \"\"\"
    def run(x):
        return x * 2
  \"\"\"
  instances {
    h=8
  }
}
"""

_API = """
import torch


def pack_t(input, out=None):
    result = (input * 2).t()
    if out is None:
        return result.contiguous()
    out.copy_(result)
    return out
"""


def _load_laid_out(tmp_path):
    (tmp_path / "python").mkdir(parents=True)
    (tmp_path / "python" / "bufdemo_api.py").write_text(textwrap.dedent(_API))
    api, module = generated_package(
        tmp_path, _LAID_OUT, "bufdemo_kernels", "bufdemo_api", "bufdemo_kernels.pack_t"
    )
    return api, module.pack_t


def test_a_buffer_a_result_rule_lays_out_is_not_the_solutions(tmp_path):
    # The caller's buffer holds the output as the API lays it out ([h, n]); a destination-
    # passing solution writes one of the definition's ([n, h]), which `result` lays out.
    api, pack_t = _load_laid_out(tmp_path)
    x, given = torch.randn(3, 8), []

    def solution(x, y):
        given.append(y)
        y.copy_(x * 2)

    out = torch.empty(8, 3)
    with rt.enable_apply({"pack_t_h8": solution}):
        assert pack_t(x, out=out) is out
        counts = rt.stats()["bufdemo_api.pack_t"]
    assert (counts["hit"], counts["fallback_guard"]) == (1, 0)
    assert len(given) == 1 and given[0] is not out and given[0].shape == (3, 8)
    assert torch.equal(out, api.pack_t(x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlashInfer's own kernel on a GPU")
def test_on_a_gpu_a_bad_buffer_gets_what_flashinfers_own_kernel_does():
    # No stand-in: FlashInfer's rmsnorm kernel, JIT-built, decides what a bad buffer gets.
    x = torch.randn(4, 4096, device="cuda").to(torch.bfloat16)
    w = torch.randn(4096, device="cuda").to(torch.bfloat16)
    seen: list = []
    good = torch.empty_like(x)
    # Zeroed: FlashInfer's kernel writes bf16 bits into the first half of a float32 buffer,
    # and leaves the rest as it was.
    for make in (
        lambda: torch.zeros(4, 4096, device="cuda"),
        lambda: torch.zeros(2, 4096, dtype=torch.bfloat16, device="cuda"),
        lambda: torch.zeros(4, 4096, dtype=torch.bfloat16),  # on the host
    ):
        theirs, mine = make(), make()
        try:
            flashinfer.norm.rmsnorm(x, w, 1e-5, out=theirs)  # apply off
            raised = None
        except Exception as exc:  # noqa: BLE001 - whatever FlashInfer raises, apply says too
            raised = type(exc)
        with rt.enable_apply({"rmsnorm_h4096": _dps(seen)}):
            if raised is None:
                flashinfer.norm.rmsnorm(x, w, 1e-5, out=mine)
            else:
                with pytest.raises(raised):
                    flashinfer.norm.rmsnorm(x, w, 1e-5, out=mine)
            assert rt.stats()[RMS]["rules"] == {"tensor:output": 1}
        torch.cuda.synchronize()
        if raised is None:
            assert torch.equal(mine, theirs)
    with rt.enable_apply({"rmsnorm_h4096": _dps(seen)}):
        assert flashinfer.norm.rmsnorm(x, w, 1e-5, out=good) is good
    assert len(seen) == 1 and seen[0] is good
    torch.testing.assert_close(good, cpu.rms(x, w, 1e-5), atol=2e-2, rtol=2e-2)


_NOT_INSTALLED = """
family doubled {
  op_type demo
  description "Rows doubled, into the caller's buffer where one is given."
  api not_installed_anywhere.doubled(input, out=None)
  axes {
    n : var
    h : const h
  }
  inputs {
    x : float32[n, h] <- input
  }
  outputs {
    y : float32[n, h] -> out
  }
  reference \"\"\"
    def run(x):
        return x * 2
  \"\"\"
  instances {
    h=8
  }
}
"""


def test_without_an_original_a_bad_buffer_is_refused_with_what_is_wrong(tmp_path):
    # No API to hand the buffer to: the call raises, saying what about the buffer is wrong.
    (module,) = generated_package(
        tmp_path, _NOT_INSTALLED, "bufdemo_not_installed", "bufdemo_not_installed.doubled"
    )
    x = torch.randn(3, 8)
    out = torch.empty(3, 8)
    assert module.doubled(x, out=out) is out and torch.equal(out, x * 2)  # the reference
    with pytest.raises(
        rt.FallbackError,
        match=re.escape(
            "the out= buffer is float64, the definition's is float32, and there is no original "
            "API to run it (only the original API takes a buffer the definition does not "
            "describe)"
        ),
    ):
        with rt.enable_apply({}):
            module.doubled(x, out=torch.empty(3, 8, dtype=torch.float64))
