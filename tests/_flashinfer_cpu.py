"""The real FlashInfer, made to run on a CPU where its kernels cannot.

FlashInfer 0.7.2's Python APIs check and convert their arguments, then call a JIT-built
kernel module, which needs a GPU. For the norms, only that module is replaced
(``norm_kernels_on_cpu``): the public functions, their signatures, defaults, aliases and
argument handling are FlashInfer's own. The paged decode wrapper builds CUDA state in its
constructor and plans on the GPU, so its constructor, ``plan`` and ``run`` are replaced on the
real class by twins with the real signatures (checked against the originals by
``test_flashinfer_apply.py``) that compute the same attention in torch: soft cap, sm_scale and
its default, q/k scales, sliding window, partly filled last pages, NHD or HND, tuple or
stacked caches. The twins keep the wrapper state under FlashInfer's own names (``_sm_scale``,
``_logits_soft_cap``, ``_window_left``, ``_pos_encoding_mode``...), so that the real
``forward``, which sets some of it and then calls ``run``, works as it does on a GPU.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import pytest
import torch

flashinfer = pytest.importorskip("flashinfer")
import flashinfer.decode  # noqa: E402
import flashinfer.norm  # noqa: E402
import flashinfer.prefill  # noqa: E402


def rms(x: torch.Tensor, w: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    xf = x.float()
    inv = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    return (xf * inv * (w.float() + offset)).to(x.dtype)


class _NormKernels:
    """What ``flashinfer.norm.get_norm_module()`` returns, computed in torch."""

    def rmsnorm(self, out, input, weight, eps, enable_pdl):  # noqa: A002
        out.copy_(rms(input, weight, eps))

    def gemma_rmsnorm(self, out, input, weight, eps, enable_pdl):  # noqa: A002
        out.copy_(rms(input, weight, eps, 1.0))

    def fused_add_rmsnorm(self, input, residual, weight, eps, enable_pdl):  # noqa: A002
        residual.add_(input)
        input.copy_(rms(residual, weight, eps))


def norm_kernels_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """FlashInfer's norm APIs as they are, with their kernel module computing in torch."""
    monkeypatch.setattr(flashinfer.norm, "get_norm_module", lambda: _NormKernels())
    monkeypatch.setattr(flashinfer.norm, "_use_cuda_norm", lambda device: True)
    monkeypatch.setattr(flashinfer.norm, "device_support_pdl", lambda device: False)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)


class _ActivationKernels:
    """What ``flashinfer.activation.get_act_and_mul_module("silu")`` returns, in torch."""

    def silu_and_mul(self, out, input, enable_pdl):  # noqa: A002
        out.copy_(silu_and_mul(input))


def activation_kernels_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """FlashInfer's silu_and_mul as it is, with its kernel module computing in torch."""
    import flashinfer.activation

    monkeypatch.setattr(
        flashinfer.activation, "get_act_and_mul_module", lambda name: _ActivationKernels()
    )
    monkeypatch.setattr(flashinfer.activation, "device_support_pdl", lambda device: False)


# ---------------------------------------------------------------------------------------
# The paged decode wrapper
# ---------------------------------------------------------------------------------------

CALLS: list[str] = []


def _init(
    self,
    float_workspace_buffer,
    kv_layout="NHD",
    use_cuda_graph=False,
    use_tensor_cores=False,
    paged_kv_indptr_buffer=None,
    paged_kv_indices_buffer=None,
    paged_kv_last_page_len_buffer=None,
    backend="auto",
    jit_args=None,
):
    self._kv_layout = kv_layout


def _plan(
    self,
    indptr,
    indices,
    last_page_len,
    num_qo_heads,
    num_kv_heads,
    head_dim,
    page_size,
    *deprecated_positional_args: Any,
    **kwargs: Any,
):
    # The state FlashInfer's _plan_impl leaves on the wrapper, under the same names: run()
    # reads it from there, so forward() (which sets some of it, then calls run) behaves as
    # FlashInfer's does.
    CALLS.append("plan")
    cap = kwargs.get("logits_soft_cap")
    self._paged_kv_indptr_buf = indptr
    self._paged_kv_indices_buf = indices
    self._paged_kv_last_page_len_buf = last_page_len
    self._num_qo_heads, self._num_kv_heads, self._page_size = num_qo_heads, num_kv_heads, page_size
    self._plan_info = [len(last_page_len), head_dim]  # a new object per plan, as the kernel's
    self._pos_encoding_mode = kwargs.get("pos_encoding_mode", "NONE")
    self._window_left = kwargs.get("window_left", -1)
    self._logits_soft_cap = 0.0 if cap is None else cap
    self._sm_scale = kwargs.get("sm_scale")
    self._rope_scale = kwargs.get("rope_scale")
    self._rope_theta = kwargs.get("rope_theta")


def _unpack(cache, layout):
    k, v = (cache[:, 0], cache[:, 1]) if isinstance(cache, torch.Tensor) else cache
    if layout == "HND":
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    return k, v


def _run(
    self,
    q,
    paged_kv_cache,
    *args,
    q_scale=None,
    k_scale=None,
    v_scale=None,
    out=None,
    lse=None,
    return_lse=False,
    enable_pdl=None,
    window_left=None,
    sinks=None,
    q_len_per_req=None,
    skip_softmax_threshold_scale_factor=None,
    kv_cache_sf=None,
):
    CALLS.append("run")
    if self._pos_encoding_mode != "NONE":
        raise NotImplementedError("the CPU twin applies no position encoding")
    indptr, indices = self._paged_kv_indptr_buf, self._paged_kv_indices_buf
    last_page_len, page_size = self._paged_kv_last_page_len_buf, self._page_size
    k_cache, v_cache = _unpack(paged_kv_cache, self._kv_layout)
    window = self._window_left if window_left is None else window_left
    sm_scale = self._sm_scale
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    sm_scale *= (q_scale or 1.0) * (k_scale or 1.0)
    cap = self._logits_soft_cap or 0.0
    batch, heads = q.shape[0], q.shape[1]
    group = heads // self._num_kv_heads
    o = torch.zeros_like(q)
    s = torch.full((batch, heads), -math.inf)
    for b in range(batch):
        pages = indices[indptr[b] : indptr[b + 1]].long()
        n = (pages.numel() - 1) * page_size + int(last_page_len[b])
        first = max(0, n - 1 - window) if window >= 0 else 0  # the query is token n - 1
        k = k_cache[pages].flatten(0, 1)[first:n].float().repeat_interleave(group, dim=1)
        v = v_cache[pages].flatten(0, 1)[first:n].float().repeat_interleave(group, dim=1)
        logits = torch.einsum("hd,thd->ht", q[b].float(), k) * sm_scale
        if cap > 0:
            logits = cap * torch.tanh(logits / cap)
        s[b] = torch.logsumexp(logits, dim=-1) / math.log(2)
        o[b] = (torch.einsum("ht,thd->hd", logits.softmax(-1), v) * (v_scale or 1.0)).to(q.dtype)
    if out is not None:
        out.copy_(o)
        o = out
    if lse is not None:
        lse.copy_(s)
        s = lse
    return (o, s) if return_lse else o


DECODE = flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper
TWINS = {"__init__": _init, "plan": _plan, "begin_forward": _plan, "run": _run}


def decode_wrapper_on_cpu(monkeypatch: pytest.MonkeyPatch) -> type:
    """The real wrapper class, its constructor, plan (and its alias) and run run in torch."""
    CALLS.clear()
    for name, twin in TWINS.items():
        monkeypatch.setattr(DECODE, name, twin)
    return DECODE


def decode_case(
    batch: int = 3,
    heads: int = 32,
    kv_heads: int = 8,
    dim: int = 128,
    page_size: int = 16,
    full: bool = False,
    seed: int = 0,
) -> dict[str, Any]:
    """A decode batch: pages per sequence, last pages partly filled unless ``full``."""
    g = torch.Generator().manual_seed(seed)
    pages_per_seq = torch.randint(1, 4, (batch,), generator=g)
    indptr = torch.zeros(batch + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(pages_per_seq, 0)
    num_pages = int(indptr[-1]) + 2
    indices = torch.randperm(num_pages, generator=g)[: int(indptr[-1])].to(torch.int32)
    if full:
        last = torch.full((batch,), page_size, dtype=torch.int32)
    else:
        last = torch.randint(1, page_size + 1, (batch,), generator=g, dtype=torch.int32)
        last[0] = max(1, page_size - 1)  # at least one partly filled page
    shape = (num_pages, page_size, kv_heads, dim)
    k = torch.randn(*shape, generator=g).to(torch.bfloat16)
    v = torch.randn(*shape, generator=g).to(torch.bfloat16)
    q = torch.randn(batch, heads, dim, generator=g).to(torch.bfloat16)
    return {"indptr": indptr, "indices": indices, "last": last, "k": k, "v": v, "q": q}


# ---------------------------------------------------------------------------------------
# The prefill wrappers, for routing only
# ---------------------------------------------------------------------------------------


def _keeping_signature(real: Any, body: Any) -> Any:
    """``body`` under ``real``'s signature, which the patcher compares with the api line."""

    @functools.wraps(real)
    def twin(*args: Any, **kwargs: Any) -> Any:
        return body(*args, **kwargs)

    return twin


def prefill_wrappers_that_record(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Both prefill wrappers keep their signatures; their run returns zeros and is recorded.

    What FlashInfer computes is not modelled: these serve tests of where calls go.
    """
    calls: list[str] = []

    def init(self, float_workspace_buffer, kv_layout="NHD", *args, **kwargs):
        self._kv_layout = kv_layout

    def plan(self, *args, **kwargs):
        calls.append("plan")
        # As FlashInfer's plan() does on every path; a run is routed only while it stands.
        self._pos_encoding_mode = kwargs.get("pos_encoding_mode", "NONE")

    def run(self, q, *args, **kwargs):
        calls.append("run")
        return torch.zeros_like(q)

    for cls in (
        flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper,
        flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper,
    ):
        for name, body in (("__init__", init), ("plan", plan), ("run", run)):
            monkeypatch.setattr(cls, name, _keeping_signature(getattr(cls, name), body))
        # As in FlashInfer: a partialmethod of the run the class was made with, not of a
        # patched one.
        monkeypatch.setattr(
            cls, "run_return_lse", functools.partialmethod(cls.run, return_lse=True)
        )
    return calls
