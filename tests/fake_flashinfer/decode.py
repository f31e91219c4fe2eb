"""A stateful plan/run wrapper shaped like flashinfer.decode's."""

import torch

from fake_flashinfer.calls import CALLS


class BatchDecodeWithPagedKVCacheWrapper:
    """``plan`` receives the page table, ``run`` the queries and the cache."""

    def plan(
        self,
        indptr,
        indices,
        last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        sm_scale=None,
    ):
        CALLS.append("plan")
        self._indptr, self._indices = indptr, indices
        self._sm_scale = sm_scale if sm_scale is not None else head_dim**-0.5

    def run(self, q, paged_kv_cache, *, out=None, lse=None, return_lse=False):
        CALLS.append("run")
        o = torch.zeros_like(q) if out is None else out.zero_()
        s = q.new_zeros(q.shape[:2], dtype=torch.float32) if lse is None else lse.zero_()
        return (o, s) if return_lse else o
