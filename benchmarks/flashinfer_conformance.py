"""Conformance of Trace Apply with the real FlashInfer 0.7.2, on a GPU.

    python benchmarks/flashinfer_conformance.py [--only SUBSTRING ...] [--json FILE]
        [--prebuild N]

For every API of the catalogue, calls the real FlashInfer function with apply off and with
apply on, over a grid of cases: several var-axis sizes, and a non-default value of the
parameters its rules hold. Apply on registers, for every definition of the family, a Python
solution that runs the definition's reference. Each case must either be routed and match
FlashInfer within the definition's tolerance (samplers: by their distribution), or fall back
with the rule the case expects; and apply on may raise nothing that apply off does not.
Prints one table per API (cases, routed, fell back by rule, max error, failures), then the
overhead of a hit against FlashInfer's own Trace Apply on rmsnorm, and writes every case's
figures to --json.

A case that FlashInfer itself cannot run on this GPU (its MoE kernels need SM100; its GDN
kernels need nvidia-cutlass-dsl) is reported as such: its calls must still behave alike.
FlashInfer JIT-builds one module per kernel variant; --prebuild N builds them in N processes
first, for at most --deadline seconds; a call still running then is reported and not run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "generated" / "python"))

import fibgen.runtime as rt  # noqa: E402
from fibgen.runtime.compare import compare, default_tolerance  # noqa: E402

DEV = "cuda"
WORKSPACE = 256 * 1024 * 1024


# ---------------------------------------------------------------------------------------
# The catalogue: definitions, their references as solutions, their tolerances
# ---------------------------------------------------------------------------------------


def _catalogue():
    from fibgen.compiler import compile_paths

    result = compile_paths([str(ROOT / "definitions")])
    assert result.ok, "the catalogue does not compile"
    families = {f.name: f for f in result.module.families()}
    return {d.name: (d, families[d.family]) for d in result.module.definitions}, families


CATALOGUE, FAMILIES = _catalogue()


def _run_of(text: str) -> Callable[..., Any]:
    namespace: dict[str, Any] = {}
    exec(compile(text, "<reference>", "exec"), namespace)
    return namespace["run"]


def solution(name: str, family: str | None = None) -> Callable[..., Any]:
    """A solution running the reference of a definition, by keyword (its inputs' names)."""
    if name in CATALOGUE:
        text = CATALOGUE[name][0].reference
    else:  # a name only the family's rule spells: its reference, with its parameters' defaults
        fam = FAMILIES[family]
        prelude = "".join(f"{p.name} = {p.default!r}\n" for p in fam.params)
        text = prelude + fam.reference
    run = _run_of(text)

    def solve(**inputs: Any) -> Any:
        return run(**inputs)

    return solve


def tolerance(name: str, family: str | None) -> tuple[float, float, float] | None:
    fam = FAMILIES[family] if family else CATALOGUE[name][1]
    t = fam.tolerance
    if t is None:
        return None
    return (t.atol, t.rtol, t.matched if t.matched is not None else 1.0)


# ---------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------


@dataclass
class Case:
    """One call of an API, with what apply must do with it.

    ``call`` makes fresh inputs from a fixed seed and returns what the caller sees: the result
    and the tensors the API writes in place. ``solutions`` are registered when apply is on;
    ``expect`` is None for a call that must be routed, else the rule it must fall back by.
    """

    api: str
    label: str
    call: Callable[[], tuple]
    solutions: dict[str, Callable[..., Any]]
    expect: str | None = None
    tol: tuple[float, float, float] | None = None
    samples: bool = False  # compare sampled ids by their distribution


@dataclass
class Outcome:
    case: str
    routed: bool = False
    rule: str | None = None
    max_abs: float = 0.0
    error_off: str | None = None
    error_on: str | None = None
    failure: str | None = None
    extra: dict = field(default_factory=dict)


def g(seed: int) -> torch.Generator:
    gen = torch.Generator(device=DEV)
    gen.manual_seed(seed)
    return gen


def rnd(*shape, dtype=torch.bfloat16, seed=0, scale=1.0):
    return (torch.randn(*shape, device=DEV, generator=g(seed)) * scale).to(dtype)


def _norm_cases() -> list[Case]:
    import flashinfer

    out: list[Case] = []
    api = "flashinfer.norm.rmsnorm"
    for h, eps in ((4096, 1e-5), (2048, 1e-6)):
        name = f"rmsnorm_h{h}"
        sols = {name: solution(name)}
        for rows in (1, 64, 1000):

            def call(rows=rows, h=h, eps=eps):
                x, w = rnd(rows, h, seed=1), rnd(h, seed=2)
                return (flashinfer.norm.rmsnorm(x, w, eps=eps),)

            out.append(Case(api, f"{name} rows={rows} eps={eps}", call, sols))

        def with_out(h=h, eps=eps):
            x, w, o = rnd(7, h, seed=1), rnd(h, seed=2), torch.empty(7, h, device=DEV).bfloat16()
            r = flashinfer.norm.rmsnorm(x, w, eps, o, enable_pdl=False)
            return (r, o, torch.tensor(float(r is o)))

        out.append(Case(api, f"{name} out= enable_pdl=False", with_out, sols))
    sols = {"rmsnorm_h4096": solution("rmsnorm_h4096")}
    out.append(
        Case(
            api,
            "rmsnorm_h4096 eps=1e-6 (FlashInfer's default)",
            lambda: (flashinfer.norm.rmsnorm(rnd(8, 4096, seed=1), rnd(4096, seed=2)),),
            sols,
            expect="eps",
        )
    )
    out.append(
        Case(
            api,
            "rmsnorm_h4096 float16 input",
            lambda: (
                flashinfer.norm.rmsnorm(
                    rnd(8, 4096, seed=1, dtype=torch.float16),
                    rnd(4096, seed=2, dtype=torch.float16),
                    1e-5,
                ),
            ),
            sols,
            expect="tensor:hidden_states",
        )
    )
    out.append(
        Case(
            api,
            "rmsnorm_h4096 3-D input (q/k norm)",
            lambda: (flashinfer.norm.rmsnorm(rnd(2, 3, 4096, seed=1), rnd(4096, seed=2), 1e-5),),
            sols,
            expect="tensor:hidden_states",
        )
    )

    api = "flashinfer.norm.fused_add_rmsnorm"
    for rows in (1, 64):
        name = "fused_add_rmsnorm_h4096"

        def fused(rows=rows, eps=1e-5):
            x, r, w = rnd(rows, 4096, seed=1), rnd(rows, 4096, seed=3), rnd(4096, seed=2)
            flashinfer.norm.fused_add_rmsnorm(x, r, w, eps, enable_pdl=True)
            return (x, r)

        out.append(Case(api, f"{name} rows={rows}", fused, {name: solution(name)}))

    def fused_default():
        x, r, w = rnd(4, 4096, seed=1), rnd(4, 4096, seed=3), rnd(4096, seed=2)
        flashinfer.norm.fused_add_rmsnorm(x, r, w)
        return (x, r)

    out.append(
        Case(
            api,
            "fused_add_rmsnorm_h4096 eps=1e-6",
            fused_default,
            {"fused_add_rmsnorm_h4096": solution("fused_add_rmsnorm_h4096")},
            expect="eps",
        )
    )

    api = "flashinfer.norm.gemma_rmsnorm"
    for rows in (1, 64):
        out.append(
            Case(
                api,
                f"gemma_rmsnorm_h2304 rows={rows}",
                lambda rows=rows: (
                    flashinfer.norm.gemma_rmsnorm(rnd(rows, 2304, seed=1), rnd(2304, seed=2)),
                ),
                {"gemma_rmsnorm_h2304": solution("gemma_rmsnorm_h2304")},
            )
        )
    out.append(
        Case(
            api,
            "gemma_rmsnorm_h2304 eps=1e-5",
            lambda: (flashinfer.norm.gemma_rmsnorm(rnd(4, 2304, seed=1), rnd(2304, seed=2), 1e-5),),
            {"gemma_rmsnorm_h2304": solution("gemma_rmsnorm_h2304")},
            expect="eps",
        )
    )

    api = "flashinfer.norm.layernorm"

    def ln(rows, eps):
        x = rnd(rows, 768, seed=1)
        gamma = rnd(768, seed=2, dtype=torch.float32)
        beta = rnd(768, seed=3, dtype=torch.float32)
        return (flashinfer.norm.layernorm(x, gamma, beta, eps),)

    sols = {"layernorm_h768": solution("layernorm_h768")}
    for rows in (1, 64):
        out.append(Case(api, f"layernorm_h768 rows={rows}", lambda rows=rows: ln(rows, 1e-6), sols))
    out.append(Case(api, "layernorm_h768 eps=1e-5", lambda: ln(4, 1e-5), sols, expect="eps"))
    return out


def _activation_cases() -> list[Case]:
    import flashinfer

    out = []
    for fn in ("silu_and_mul", "gelu_and_mul"):
        api = f"flashinfer.activation.{fn}"
        h = min(int(n.split("_h")[1].split("_")[0]) for n in CATALOGUE if n.startswith(fn))
        for dtype, part in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
            name = f"{fn}_h{h}_{part}"
            for rows in (1, 64):

                def call(fn=fn, rows=rows, dtype=dtype, h=h):
                    x = rnd(rows, 2 * h, seed=1, dtype=dtype)
                    return (getattr(flashinfer.activation, fn)(x, enable_pdl=False),)

                out.append(Case(api, f"{name} rows={rows}", call, {name: solution(name)}))

        def with_out(fn=fn, h=h):
            x = rnd(3, 2 * h, seed=1)
            o = torch.empty(3, h, device=DEV, dtype=torch.bfloat16)
            r = getattr(flashinfer.activation, fn)(x, o)
            return (r, o, torch.tensor(float(r is o)))

        name = f"{fn}_h{h}_bf16"
        out.append(Case(api, f"{name} out=", with_out, {name: solution(name)}))
    return out


def _cascade_cases() -> list[Case]:
    import flashinfer

    out = []
    for seq in (1, 100):

        def call(seq=seq):
            va, vb = rnd(seq, 32, 128, seed=1), rnd(seq, 32, 128, seed=2)
            sa = rnd(seq, 32, seed=3, dtype=torch.float32, scale=4.0)
            sb = rnd(seq, 32, seed=4, dtype=torch.float32, scale=4.0)
            return flashinfer.cascade.merge_state(va, sa, vb, sb)

        name = "merge_state_h32_d128"
        out.append(
            Case(
                "flashinfer.cascade.merge_state", f"{name} seq={seq}", call, {name: solution(name)}
            )
        )
    return out


def _paged_layout(seed, batch, page_size, kv_heads=8, dim=128, full=False, extra_pages=3):
    gen = torch.Generator().manual_seed(seed)
    pages = torch.randint(1, 5, (batch,), generator=gen)
    indptr = torch.zeros(batch + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(pages, 0)
    total = int(indptr[-1])
    num_pages = total + extra_pages
    indices = torch.randperm(num_pages, generator=gen)[:total].to(torch.int32)
    if full or page_size == 1:
        last = torch.full((batch,), page_size, dtype=torch.int32)
    else:
        last = torch.randint(1, page_size + 1, (batch,), generator=gen, dtype=torch.int32)
        last[0] = max(1, page_size // 2)
    shape = (num_pages, page_size, kv_heads, dim)
    k = rnd(*shape, seed=seed + 1)
    v = rnd(*shape, seed=seed + 2)
    return {
        "indptr": indptr.to(DEV),
        "indices": indices.to(DEV),
        "last": last.to(DEV),
        "k": k,
        "v": v,
        "num_pages": num_pages,
    }


def _kv(layout, k, v, stacked):
    if layout == "HND":
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    return torch.stack([k, v], dim=1) if stacked else (k, v)


def _page_cases() -> list[Case]:
    import flashinfer

    out = []
    api = "flashinfer.page.append_paged_kv_cache"
    for page_size, layout, stacked in ((1, "NHD", False), (16, "NHD", False), (16, "HND", True)):
        name = f"append_paged_kv_cache_kv8_d128_ps{page_size}"

        def call(page_size=page_size, layout=layout, stacked=stacked):
            lay = _paged_layout(5, 3, page_size)
            batch = 3
            # One new token per sequence, at its last position.
            lens = (lay["indptr"][1:] - lay["indptr"][:-1] - 1) * page_size + lay["last"]
            positions = (lens - 1).to(torch.int32)
            batch_indices = torch.arange(batch, device=DEV, dtype=torch.int32)
            ak, av = rnd(batch, 8, 128, seed=7), rnd(batch, 8, 128, seed=8)
            cache = _kv(layout, lay["k"], lay["v"], stacked)
            flashinfer.page.append_paged_kv_cache(
                ak,
                av,
                batch_indices,
                positions,
                cache,
                lay["indices"],
                lay["indptr"],
                lay["last"],
                kv_layout=layout,
            )
            return tuple(cache) if isinstance(cache, tuple) else (cache,)

        sols = {name: solution(name, "append_paged_kv_cache")}
        out.append(Case(api, f"{name} {layout} {'stacked' if stacked else 'tuple'}", call, sols))
    return out


def _rope_cases() -> list[Case]:
    import flashinfer

    out = []
    api = "flashinfer.rope.apply_rope_with_cos_sin_cache_inplace"
    name = "rope_with_cos_sin_cache_neox_style_d128_rd64"
    for tokens, neox in ((1, True), (77, True), (8, False)):

        def call(tokens=tokens, neox=neox):
            q, k = rnd(tokens, 32 * 128, seed=1), rnd(tokens, 8 * 128, seed=2)
            cache = rnd(4096, 64, seed=3, dtype=torch.float32)
            pos = torch.randint(0, 4096, (tokens,), device=DEV, generator=g(4))
            flashinfer.rope.apply_rope_with_cos_sin_cache_inplace(pos, q, k, 128, cache, neox)
            return (q, k)

        out.append(
            Case(
                api,
                f"{name} tokens={tokens} is_neox={neox}",
                call,
                {name: solution(name)},
                expect=None if neox else "is_neox",
            )
        )
    return out


def _sampling_cases() -> list[Case]:
    import flashinfer

    out = []
    # 2048 draws of a distribution over 8 tokens: sampling noise puts two samplers of the same
    # distribution about 0.035 apart in total variation; a wrong filter, 0.1 or more. No two
    # weights tie, so the top-k and top-p sets are unambiguous.
    vocab, rows = 128256, 2048
    support = torch.tensor([5, 17, 99, 1000, 4242, 70000, 128000, 3], device=DEV)
    weights = torch.tensor([0.3, 0.2, 0.15, 0.12, 0.09, 0.07, 0.05, 0.02], device=DEV)

    def probs(floor):
        # A small tail of distinct values under every token, as a softmax leaves one:
        # FlashInfer's top_k_top_p sampler did not return within minutes on rows of exact
        # zeros, nor on a tail of one repeated value (H100, 0.7.2).
        p = floor * (1 + torch.rand(rows, vocab, device=DEV, generator=g(41)))
        p[:, support] = weights
        return p / p.sum(-1, keepdim=True)

    for fn, extra, expect in (
        ("top_k_sampling_from_probs", {"top_k": 4}, None),
        ("top_p_sampling_from_probs", {"top_p": 0.7}, None),
        ("top_k_top_p_sampling_from_probs", {"top_k": 5, "top_p": 0.8}, None),
        ("top_k_sampling_from_probs", {"top_k": 4, "return_valid": True}, "return_valid"),
    ):
        name = f"{fn}_v{vocab}"
        floor = 1e-9 if fn == "top_k_top_p_sampling_from_probs" else 0.0

        def call(fn=fn, extra=extra, floor=floor):
            torch.manual_seed(0)
            return getattr(flashinfer.sampling, fn)(probs(floor), **extra)

        out.append(
            Case(
                f"flashinfer.sampling.{fn}",
                f"{name} {extra}",
                call,
                {name: solution(name)},
                expect=expect,
                samples=expect is None,
            )
        )
    return out


def _decode_wrapper(layout="NHD"):
    import flashinfer

    ws = torch.empty(WORKSPACE, dtype=torch.uint8, device=DEV)
    return flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper(ws, kv_layout=layout)


def _decode_cases() -> list[Case]:
    api = "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run"
    out = []
    grid = [
        # (label, page_size, batch, plan kwargs, run kwargs, layout, expect)
        ("ps1 full pages", 1, 8, {}, {}, "NHD", None),
        ("ps64 batch=1", 64, 1, {}, {}, "NHD", None),
        ("ps64 batch=16", 64, 16, {}, {}, "NHD", None),
        ("ps16 (named by rule)", 16, 4, {}, {}, "NHD", None),
        (
            "ps64 sm_scale=0.1 return_lse",
            64,
            4,
            {"sm_scale": 0.1},
            {"return_lse": True},
            "NHD",
            None,
        ),
        ("ps64 HND stacked", 64, 4, {}, {"stacked": True}, "HND", None),
        ("ps64 enable_pdl=False", 64, 4, {}, {"enable_pdl": False}, "NHD", None),
        (
            "ps64 logits_soft_cap=30",
            64,
            4,
            {"logits_soft_cap": 30.0},
            {},
            "NHD",
            "plan.logits_soft_cap",
        ),
        ("ps64 window_left=32", 64, 4, {"window_left": 32}, {}, "NHD", "plan.window_left"),
        ("ps64 q_scale=0.5", 64, 4, {}, {"q_scale": 0.5}, "NHD", "q_scale"),
        (
            "ps64 q_data_type=float16",
            64,
            4,
            {"q_data_type": "float16"},
            {},
            "NHD",
            "plan.q_data_type",
        ),
    ]
    for label, ps, batch, plan_kw, run_kw, layout, expect in grid:
        family = "gqa_paged_decode_full_pages" if ps == 1 else "gqa_paged_decode"
        name = f"gqa_paged_decode_h32_kv8_d128_ps{ps}"

        def call(ps=ps, batch=batch, plan_kw=plan_kw, run_kw=run_kw, layout=layout):
            lay = _paged_layout(11, batch, ps)
            wrapper = _decode_wrapper(layout)
            kw = {"q_data_type": torch.bfloat16, **plan_kw}
            wrapper.plan(lay["indptr"], lay["indices"], lay["last"], 32, 8, 128, ps, **kw)
            run_kw = dict(run_kw)
            cache = _kv(layout, lay["k"], lay["v"], run_kw.pop("stacked", False))
            q = rnd(batch, 32, 128, seed=12)
            result = wrapper.run(q, cache, **run_kw)
            return result if isinstance(result, tuple) else (result,)

        sols = {name: solution(name, family)}
        out.append(Case(api, f"{name} {label}", call, sols, expect=expect))
    return out


def _prefill_wrapper(layout="NHD"):
    import flashinfer

    ws = torch.empty(WORKSPACE, dtype=torch.uint8, device=DEV)
    return flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper(ws, kv_layout=layout)


def _prefill_cases() -> list[Case]:
    api = "flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper.run"
    out = []
    grid = [
        ("ps1 full pages", 1, 3, {}, None),
        ("ps64", 64, 3, {}, None),
        ("ps64 batch=1", 64, 1, {}, None),
        ("ps64 not causal", 64, 3, {"causal": False}, "plan.causal"),
        ("ps64 logits_soft_cap=30", 64, 3, {"logits_soft_cap": 30.0}, "plan.logits_soft_cap"),
    ]
    for label, ps, batch, plan_kw, expect in grid:
        family = (
            "gqa_paged_prefill_causal_full_pages"
            if ps == 1
            else "gqa_paged_prefill_causal_batch_axis"
        )
        name = f"gqa_paged_prefill_causal_h32_kv8_d128_ps{ps}"

        def call(ps=ps, batch=batch, plan_kw=plan_kw):
            lay = _paged_layout(21, batch, ps)
            lens = (lay["indptr"][1:] - lay["indptr"][:-1] - 1) * ps + lay["last"]
            q_lens = torch.minimum(lens, torch.full_like(lens, 5))
            qo_indptr = torch.zeros(batch + 1, dtype=torch.int32, device=DEV)
            qo_indptr[1:] = torch.cumsum(q_lens, 0)
            wrapper = _prefill_wrapper()
            kw = {"causal": True, "q_data_type": torch.bfloat16, **plan_kw}
            wrapper.plan(
                qo_indptr, lay["indptr"], lay["indices"], lay["last"], 32, 8, 128, ps, **kw
            )
            q = rnd(int(qo_indptr[-1]), 32, 128, seed=22)
            return wrapper.run(q, (lay["k"], lay["v"]), return_lse=True)

        out.append(
            Case(api, f"{name} {label}", call, {name: solution(name, family)}, expect=expect)
        )

    api = "flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper.run"
    for family, name, heads, kv_heads, qk, vo in (
        ("gqa_ragged_prefill_causal", "gqa_ragged_prefill_causal_h32_kv8_d128", 32, 8, 128, 128),
        (
            "mla_ragged_prefill_causal",
            "mla_ragged_prefill_causal_h16_qk192_vo128",
            16,
            16,
            192,
            128,
        ),
    ):
        for causal in (True, False):

            def call(heads=heads, kv_heads=kv_heads, qk=qk, vo=vo, causal=causal):
                import flashinfer

                kv_lens = torch.tensor([7, 30, 3], device=DEV)
                q_lens = torch.tensor([2, 30, 3], device=DEV)
                qo = torch.zeros(4, dtype=torch.int32, device=DEV)
                kvp = torch.zeros(4, dtype=torch.int32, device=DEV)
                qo[1:], kvp[1:] = torch.cumsum(q_lens, 0), torch.cumsum(kv_lens, 0)
                ws = torch.empty(WORKSPACE, dtype=torch.uint8, device=DEV)
                wrapper = flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper(ws)
                wrapper.plan(
                    qo,
                    kvp,
                    heads,
                    kv_heads,
                    qk,
                    head_dim_vo=vo,
                    causal=causal,
                    q_data_type=torch.bfloat16,
                )
                q = rnd(int(qo[-1]), heads, qk, seed=31)
                k = rnd(int(kvp[-1]), kv_heads, qk, seed=32)
                v = rnd(int(kvp[-1]), kv_heads, vo, seed=33)
                return wrapper.run(q, k, v, return_lse=True)

            out.append(
                Case(
                    api,
                    f"{name} causal={causal}",
                    call,
                    {name: solution(name, family)},
                    expect=None if causal else "plan.causal",
                )
            )
    return out


def _mla_cases() -> list[Case]:
    api = "flashinfer.mla.BatchMLAPagedAttentionWrapper.run"
    out = []
    for label, ps, decode, family in (
        ("decode ps1", 1, True, "mla_paged_decode_full_pages"),
        ("decode ps64", 64, True, "mla_paged_decode"),
        ("prefill ps1", 1, False, "mla_paged_prefill_causal_full_pages"),
        ("prefill ps64", 64, False, "mla_paged_prefill_causal"),
    ):
        kind = "decode" if decode else "prefill_causal"
        name = f"mla_paged_{kind}_h16_ckv512_kpe64_ps{ps}"

        def call(ps=ps, decode=decode):
            import flashinfer

            batch = 3
            gen = torch.Generator().manual_seed(41)
            kv_lens = torch.randint(ps if ps > 1 else 1, 4 * ps + 2, (batch,), generator=gen)
            pages = (kv_lens + ps - 1) // ps
            kv_indptr = torch.zeros(batch + 1, dtype=torch.int32)
            kv_indptr[1:] = torch.cumsum(pages, 0)
            num_pages = int(kv_indptr[-1]) + 2
            kv_indices = torch.randperm(num_pages, generator=gen)[: int(kv_indptr[-1])].int()
            q_lens = (
                torch.ones(batch, dtype=torch.int64)
                if decode
                else torch.minimum(kv_lens, torch.full_like(kv_lens, 4))
            )
            qo = torch.zeros(batch + 1, dtype=torch.int32)
            qo[1:] = torch.cumsum(q_lens, 0)
            total_q = int(qo[-1])
            ws = torch.empty(WORKSPACE, dtype=torch.uint8, device=DEV)
            wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws)
            wrapper.plan(
                qo.to(DEV),
                kv_indptr.to(DEV),
                kv_indices.to(DEV),
                kv_lens.int().to(DEV),
                16,
                512,
                64,
                ps,
                not decode,
                1 / math.sqrt(192),
                torch.bfloat16,
                torch.bfloat16,
            )
            q_nope, q_pe = rnd(total_q, 16, 512, seed=42), rnd(total_q, 16, 64, seed=43)
            ckv, kpe = rnd(num_pages, ps, 512, seed=44), rnd(num_pages, ps, 64, seed=45)
            return wrapper.run(q_nope, q_pe, ckv, kpe, return_lse=True)

        out.append(Case(api, f"{name} {label}", call, {name: solution(name, family)}))
    return out


def _mamba_cases() -> list[Case]:
    import flashinfer

    out = []
    api = "flashinfer.mamba.selective_state_update.selective_state_update"
    name = "mamba_ssu_decode_h64_d64_s128_ng4"
    d, _ = CATALOGUE[name]
    consts = dict(d.consts)
    nh, hd, ds, ng = consts["nheads"], consts["head_dim"], consts["dstate"], consts["ngroups"]
    for batch, softplus in ((1, True), (16, True), (4, False)):

        def call(batch=batch, softplus=softplus):
            cache = 2 * batch + 1
            state = rnd(cache, nh, hd, ds, seed=51)
            x = rnd(batch, nh, hd, seed=52)
            # TIE_HDIM, as the definition says and FlashInfer's kernel checks: A, dt, D and
            # dt_bias hold one value per head, broadcast over head_dim (and dstate).
            dt = rnd(batch, nh, seed=53)[:, :, None].expand(batch, nh, hd)
            A = -torch.rand(nh, device=DEV, generator=g(54)) * 15 - 1
            A = A[:, None, None].expand(nh, hd, ds)
            B, C = rnd(batch, ng, ds, seed=55), rnd(batch, ng, ds, seed=56)
            D = rnd(nh, seed=57)[:, None].expand(nh, hd)
            dt_bias = rnd(nh, seed=58)[:, None].expand(nh, hd)
            idx = torch.randperm(cache, device=DEV, generator=g(59))[:batch].int()
            o = flashinfer.mamba.selective_state_update(
                state,
                x,
                dt,
                A,
                B,
                C,
                D,
                dt_bias=dt_bias,
                dt_softplus=softplus,
                state_batch_indices=idx,
            )
            return (o, state)

        out.append(
            Case(
                api,
                f"{name} batch={batch} dt_softplus={softplus}",
                call,
                {name: solution(name)},
                expect=None if softplus else "dt_softplus",
            )
        )
    return out


def _moe_and_gdn_cases() -> list[Case]:
    """One call each: FlashInfer runs these only where this GPU and package allow."""
    import flashinfer

    out = []
    name = next(n for n in CATALOGUE if n.startswith("gdn_decode"))
    d, _ = CATALOGUE[name]
    c = dict(d.consts)

    def gdn():
        import flashinfer.gdn_decode  # not imported by `import flashinfer`

        b, hq, hv, k = 2, c["num_q_heads"], c["num_v_heads"], c["head_size"]
        q, kk = rnd(b, 1, hq, k, seed=61), rnd(b, 1, hq, k, seed=62)
        v = rnd(b, 1, hv, k, seed=63)
        state = rnd(b, hv, k, k, seed=64, dtype=torch.float32)
        A_log, dt_bias = rnd(hv, seed=65, dtype=torch.float32), rnd(
            hv, seed=66, dtype=torch.float32
        )
        a, bb = rnd(b, 1, hv, seed=67), rnd(b, 1, hv, seed=68)
        o, s = flashinfer.gdn_decode.gated_delta_rule_decode(q, kk, v, state, A_log, a, dt_bias, bb)
        return (o, s)

    out.append(
        Case(
            "flashinfer.gdn_decode.gated_delta_rule_decode",
            f"{name} batch=2",
            gdn,
            {name: solution(name)},
        )
    )
    return out


GROUPS = {
    "norm": _norm_cases,
    "activation": _activation_cases,
    "cascade": _cascade_cases,
    "page": _page_cases,
    "rope": _rope_cases,
    "sampling": _sampling_cases,
    "decode": _decode_cases,
    "prefill": _prefill_cases,
    "mla": _mla_cases,
    "mamba": _mamba_cases,
    "other": _moe_and_gdn_cases,
}


# ---------------------------------------------------------------------------------------
# Running a case
# ---------------------------------------------------------------------------------------


def _stats_of(api: str) -> dict:
    return rt.stats().get(api, {})


def _distribution_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """Total variation distance between the empirical distributions of two id samples."""
    ids = torch.cat([a, b]).long().unique()
    pa = torch.stack([(a.long() == i).float().mean() for i in ids])
    pb = torch.stack([(b.long() == i).float().mean() for i in ids])
    return float((pa - pb).abs().sum() / 2)


def _results(value) -> tuple:
    """A call's results as a tuple: a lone tensor is one result, not its rows."""
    return (value,) if isinstance(value, torch.Tensor) else tuple(value)


def run_case(case: Case) -> Outcome:
    outcome = Outcome(case.label)
    try:
        off = _results(case.call())
        torch.cuda.synchronize()
    except Exception as exc:
        off, outcome.error_off = None, f"{type(exc).__name__}: {str(exc)[:200]}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.enable_apply(case.solutions)
    try:
        on = _results(case.call())
        torch.cuda.synchronize()
    except Exception as exc:
        on, outcome.error_on = None, f"{type(exc).__name__}: {str(exc)[:200]}"
        outcome.extra["traceback"] = traceback.format_exc()[-1500:]
    counts = _stats_of(case.api)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.disable_apply()
    outcome.routed = counts.get("hit", 0) > 0
    rules = counts.get("rules", {})
    outcome.rule = ",".join(sorted(rules)) if rules else None
    if counts.get("error"):
        outcome.failure = f"a solution error was counted ({counts})"
    elif outcome.error_on and not outcome.error_off:
        outcome.failure = f"apply on raised where apply off did not: {outcome.error_on}"
    elif case.expect is None and not outcome.routed:
        outcome.failure = f"not routed ({counts}); FlashInfer off: {outcome.error_off or 'ran'}"
    elif case.expect is not None and (outcome.routed or outcome.rule != case.expect):
        outcome.failure = f"expected a fallback by {case.expect}, got {counts}"
    if outcome.failure or on is None or off is None:
        return outcome
    if len(on) != len(off):
        outcome.failure = f"{len(on)} results with apply on, {len(off)} off"
        return outcome
    for i, (a, b) in enumerate(zip(on, off)):
        if not isinstance(a, torch.Tensor):
            continue
        if a.dtype != b.dtype or a.shape != b.shape:
            outcome.failure = (
                f"result {i}: {a.dtype}{list(a.shape)} on, {b.dtype}{list(b.shape)} off"
            )
            return outcome
        if case.samples:
            gap = _distribution_gap(a, b)
            outcome.extra[f"tvd{i}"] = gap
            if gap > 0.1:
                outcome.failure = f"sampled ids differ in distribution (TV distance {gap:.3f})"
            continue
        name = next(iter(case.solutions))
        family = None if name in CATALOGUE else _family_of(case)
        tol = case.tol or tolerance(name, family)
        atol, rtol = default_tolerance(b.dtype) if tol is None else tol[:2]
        matched = 1.0 if tol is None else tol[2]
        result = compare(a, b, atol=atol, rtol=rtol, matched=matched)
        outcome.max_abs = max(outcome.max_abs, result.max_abs_err)
        outcome.extra[f"result{i}"] = {
            "max_abs": result.max_abs_err,
            "max_rel": result.max_rel_err,
            "matched": result.matched_ratio,
            "atol": atol,
            "rtol": rtol,
        }
        if not result.ok:
            outcome.failure = f"result {i} differs from FlashInfer's: {result}"
    return outcome


def _family_of(case: Case) -> str | None:
    for fam in FAMILIES.values():
        if fam.api is not None and fam.api.path == case.api:
            return fam.name
    return None


# ---------------------------------------------------------------------------------------
# Overhead of a hit: fibgen against FlashInfer's own Trace Apply
# ---------------------------------------------------------------------------------------


def _per_call_us(fn, n=2000, repeat=7) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(times)


def overhead() -> list[tuple[str, float]]:
    import flashinfer
    import flashinfer.trace_apply as fi_apply

    x, w = rnd(1, 4096, seed=1), rnd(4096, seed=2)
    y = torch.empty_like(x)

    def kernel(hidden_states, weight):
        return y  # the same no-op solution for both: only the routing is timed

    def fi_kernel(*args, **kwargs):
        return y

    rows = [("solution called directly", _per_call_us(lambda: kernel(x, w)))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.enable_apply({"rmsnorm_h4096": kernel})
        rows.append(
            (
                "fibgen hit (patched flashinfer.norm.rmsnorm)",
                _per_call_us(lambda: flashinfer.norm.rmsnorm(x, w, 1e-5)),
            )
        )
        rt.disable_apply()
        fi_apply.enable_apply({"rmsnorm_h4096": fi_kernel})
        try:
            rows.append(
                (
                    "FlashInfer Trace Apply hit",
                    _per_call_us(lambda: flashinfer.norm.rmsnorm(x, w, 1e-5)),
                )
            )
            rows.append(
                (
                    "FlashInfer Trace Apply stats",
                    float(
                        sum(
                            v.get("hit", 0) if isinstance(v, dict) else 0
                            for v in fi_apply.stats().values()
                        )
                    ),
                )
            )
        finally:
            fi_apply.disable_apply()
    rows.append(
        (
            "flashinfer.norm.rmsnorm itself",
            _per_call_us(lambda: flashinfer.norm.rmsnorm(x, w, 1e-5)),
        )
    )
    return rows


# ---------------------------------------------------------------------------------------
# Pre-building FlashInfer's kernels
# ---------------------------------------------------------------------------------------


def _prebuild_one(group_label: tuple[str, str]) -> tuple[str, str]:
    group, label = group_label
    for case in GROUPS[group]():
        if case.label == label:
            try:
                case.call()
                torch.cuda.synchronize()
                return label, f"built {label}"
            except Exception as exc:
                return label, f"{label}: {type(exc).__name__}: {str(exc)[:120]}"
    return label, f"{label}: not found"


def prebuild(workers: int, groups: list[str], deadline: float) -> set[str]:
    """Build in ``workers`` processes; the labels of calls that did not finish in time."""
    import multiprocessing as mp

    jobs = [(g_, c.label) for g_ in groups for c in GROUPS[g_]()]
    pending = {label for _, label in jobs}
    start = time.time()
    pool = mp.get_context("spawn").Pool(workers)
    try:
        results = pool.imap_unordered(_prebuild_one, jobs)
        while pending:
            try:
                label, line = results.next(timeout=max(1.0, start + deadline - time.time()))
            except (mp.TimeoutError, StopIteration):
                break
            pending.discard(label)
            print(f"  prebuild: {line}", flush=True)
    finally:
        pool.terminate()
    for label in sorted(pending):
        print(f"  prebuild: {label}: did not finish in {deadline:g} s", flush=True)
    print(f"prebuild: {len(jobs)} calls in {time.time() - start:.0f} s", flush=True)
    return pending


# ---------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=[], help="groups to run: " + ", ".join(GROUPS))
    parser.add_argument("--json", help="write every case's figures here")
    parser.add_argument("--prebuild", type=int, default=0, help="processes that JIT-build first")
    parser.add_argument(
        "--deadline", type=float, default=300.0, help="seconds the prebuild may take"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU and flashinfer-python 0.7.2 with its JIT", file=sys.stderr)
        return 2
    groups = [g_ for g_ in GROUPS if not args.only or any(o in g_ for o in args.only)]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    hung: set[str] = set()
    if args.prebuild:
        hung = prebuild(args.prebuild, groups, args.deadline)
    results: dict[str, list[dict]] = {}
    failures = 0
    for group in groups:
        by_api: dict[str, list[Outcome]] = {}
        for case in GROUPS[group]():
            start = time.time()
            if case.label in hung:
                # A call that did not return while building would stop the run here.
                outcome = Outcome(case.label)
                outcome.failure = "not run: its call did not finish while building"
            else:
                outcome = run_case(case)
            outcome.extra["seconds"] = round(time.time() - start, 2)
            by_api.setdefault(case.api, []).append(outcome)
            failures += outcome.failure is not None
            # A call FlashInfer itself cannot make here has nothing to compare with.
            mark = "FAIL" if outcome.failure else "not compared" if outcome.error_off else "ok"
            why = outcome.failure or (
                f"FlashInfer: {outcome.error_off}" if outcome.error_off else ""
            )
            print(
                f"  [{mark}] {case.label}: routed={outcome.routed} rule={outcome.rule} "
                f"max_abs={outcome.max_abs:.3g} {why}",
                flush=True,
            )
        for api, outcomes in by_api.items():
            _table(api, outcomes)
            results[api] = [o.__dict__ for o in outcomes]
        if args.json:  # after every group: a run stopped later keeps what it measured
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    if "norm" not in groups:  # the overhead rows call FlashInfer's rmsnorm
        return _finish(results, failures, args.json)
    print("\nhit overhead on rmsnorm 1x4096 bf16 (eager loop, same process):")
    try:
        rows = overhead()
        base = rows[0][1]
        for label, us in rows:
            if "stats" in label:
                continue
            print(f"  {label:<48} {us:8.2f} us/call  {us - base:+8.2f}")
        results["overhead"] = rows
    except Exception as exc:
        print(f"  could not measure: {type(exc).__name__}: {exc}")
    return _finish(results, failures, args.json)


def _finish(results: dict, failures: int, path: str | None) -> int:
    if path:
        Path(path).write_text(json.dumps(results, indent=1, default=str))
    print(f"\n{failures} failure(s)")
    return 1 if failures else 0


def _table(api: str, outcomes: list[Outcome]) -> None:
    routed = sum(o.routed for o in outcomes)
    rules: dict[str, int] = {}
    for o in outcomes:
        if o.rule and not o.routed:
            rules[o.rule] = rules.get(o.rule, 0) + 1
    fi_cannot = sum(1 for o in outcomes if o.error_off)
    worst = max((o.max_abs for o in outcomes), default=0.0)
    failed = sum(o.failure is not None for o in outcomes)
    fell = ", ".join(f"{k}: {v}" for k, v in sorted(rules.items())) or "-"
    print(
        f"\n{api}\n  cases {len(outcomes)}  routed {routed}  fell back {fell}  "
        f"FlashInfer raised {fi_cannot}  max error {worst:.3g}  failures {failed}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
