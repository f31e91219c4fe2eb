"""Conformance of Trace Apply with the real FlashInfer 0.7.2, on a GPU.

    python benchmarks/flashinfer_conformance.py [--only GROUP ...] [--cases REGEX]
        [--json FILE] [--prebuild N] [--deadline SECONDS] [--budget SECONDS] [--list]
        [--interleave-alone]

For every API of the catalogue (every `api` line of `fibgen list --apis`), calls the real
FlashInfer function with apply off and with apply on, over a grid of cases: several
var-axis sizes and, for the paged decode, paged and ragged prefill and MLA wrappers, a
non-default value of every parameter their rules hold (`Var`). Apply on registers, for the
case's definition, a Python solution that runs the definition's reference. Each case must
either be routed and match FlashInfer within the definition's tolerance (samplers: by their
distribution), or fall back with the rule the case expects (the rule on the parameter, read
from the catalogue); and apply on may raise nothing that apply off does not.

Prints one line per case and one table per API: cases, routed, fell back by rule, max
error, failures, and cases not run, each with its reason: FlashInfer itself raised (then
apply on must raise alike), the GPU cannot run the kernel (the trtllm-gen MoE kernels need
SM100: apply on is still checked, FlashInfer is not called), the prebuild did not finish,
or --budget ran out. A case not run is never counted as passed. Then the overhead of a hit
against FlashInfer's own Trace Apply on rmsnorm, and every case's figures to --json.

FlashInfer JIT-builds one module per kernel variant; --prebuild N builds each variant the
chosen groups need once, in N processes, for at most --deadline seconds. --budget stops
starting cases after that many seconds. --cases runs only the cases whose label the
regular expression matches, so that one call builds only their variants. On a CPU the module imports and --help and --list
work; the cases need a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import re
import statistics
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "generated" / "python"))

import fibgen.runtime as rt  # noqa: E402
from fibgen.runtime.checking.compare import compare, default_tolerance  # noqa: E402

# FIBGEN_CONFORMANCE_DEVICE=cpu runs the cases' own code on the CPU, for tests that stand in
# for FlashInfer's wrappers there (tests/test_flashinfer_conformance.py).
DEV = os.environ.get("FIBGEN_CONFORMANCE_DEVICE", "cuda")
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
    params: tuple[str, ...] = ()  # ruled parameters the case gives a non-default value
    # Why this GPU cannot run FlashInfer's kernel, or None: then FlashInfer is not called.
    needs: Callable[[], str | None] | None = None
    # Cases of one variant need the same FlashInfer kernels: --prebuild builds one of them.
    variant: str | None = None


@dataclass
class Outcome:
    case: str
    routed: bool = False
    rule: str | None = None
    max_abs: float = 0.0
    error_off: str | None = None
    error_on: str | None = None
    failure: str | None = None
    not_run: str | None = None
    extra: dict = field(default_factory=dict)


def g(seed: int) -> torch.Generator:
    gen = torch.Generator(device=DEV)
    gen.manual_seed(seed)
    return gen


def rnd(*shape, dtype=torch.bfloat16, seed=0, scale=1.0):
    return (torch.randn(*shape, device=DEV, generator=g(seed)) * scale).to(dtype)


def _workspace(zeroed: bool = False) -> torch.Tensor:
    """A FlashInfer workspace; ``zeroed`` where the kernel keeps semaphores in it."""
    make = torch.zeros if zeroed else torch.empty
    return make(WORKSPACE, dtype=torch.uint8, device=DEV)


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
        # By family: other families' names start alike (silu_and_mul_nvfp4_quantize).
        h = min(
            int(n.split("_h")[1].split("_")[0]) for n, (_, f) in CATALOGUE.items() if f.name == fn
        )
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


def _merge_more_cases() -> list[Case]:
    """merge_state_in_place (with and without its row mask) and merge_states."""
    import flashinfer

    out = []
    name = "merge_state_in_place_h32_d128"
    for masked in (False, True):

        def in_place(masked=masked):
            v, vo = rnd(100, 32, 128, seed=1), rnd(100, 32, 128, seed=2)
            s = rnd(100, 32, seed=3, dtype=torch.float32, scale=4.0)
            so = rnd(100, 32, seed=4, dtype=torch.float32, scale=4.0)
            mask = (torch.arange(100, device=DEV) % 3 != 0) if masked else None
            r = flashinfer.cascade.merge_state_in_place(v, s, vo, so, mask=mask)
            return (torch.tensor(float(r is None)), v, s)

        label = f"{name} seq=100" + (" mask=" if masked else "")
        out.append(
            Case("flashinfer.cascade.merge_state_in_place", label, in_place, {name: solution(name)})
        )
    name = "merge_states_h32_d128"
    for states in (1, 5):

        def merge(states=states):
            v = rnd(37, states, 32, 128, seed=5)
            s = rnd(37, states, 32, seed=6, dtype=torch.float32, scale=4.0)
            return flashinfer.cascade.merge_states(v, s)

        label = f"{name} seq=37 states={states}"
        out.append(Case("flashinfer.cascade.merge_states", label, merge, {name: solution(name)}))
    return out


def _single_call(api: str, qo_len: int | None) -> Callable[[Var], Callable[[], tuple]]:
    """The single-request decode (``qo_len`` None) or prefill call of a departure."""

    def call_of(var: Var) -> Callable[[], tuple]:
        def call() -> tuple:
            import flashinfer

            q_dtype, kv_dtype = var.dtypes or (BF16, BF16)
            q_shape = (32, 128) if qo_len is None else (qo_len, 32, 128)
            q = rnd(*q_shape, seed=41, dtype=q_dtype)
            k = rnd(77, 8, 128, seed=42).to(kv_dtype)
            v = rnd(77, 8, 128, seed=43).to(kv_dtype)
            if var.layout == "HND":
                k, v = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
            kw = {"kv_layout": var.layout, **_values(var.run, {"q": q, "k": k, "v": v})}
            module, function = api.rsplit(".", 1)
            fn = getattr(getattr(flashinfer, module.split(".")[-1]), function)
            return _results(fn(q, k, v, **kw))

        return call

    return call_of


def _single_shared_variations(rope_param: str) -> list[Var]:
    """Departures the single-request decode and prefill share: the modelled scale, window
    and soft cap, and the refused RoPE, LSE and FP8 scales. ``rope_param`` is the one of
    rope_scale/rope_theta whose case gives both (read only with RoPE on, so routed)."""
    other = "rope_theta" if rope_param == "rope_scale" else "rope_scale"
    return [
        Var("sm_scale", run={"sm_scale": 0.05}, route=True),
        Var("logits_soft_cap", run={"logits_soft_cap": 30.0}, route=True, jit="softcap"),
        Var("pos_encoding_mode", run={"pos_encoding_mode": "ROPE_LLAMA"}, jit="rope"),
        Var("return_lse", run={"return_lse": True}),
        Var("k_scale", run={"k_scale": 0.5}),
        Var("v_scale", run={"v_scale": 0.5}),
        Var(rope_param, run={"rope_scale": 2.0, "rope_theta": 1e4}, route=True, also=(other,)),
    ]


def _ones(c: dict) -> torch.Tensor:
    return torch.ones(1, device=DEV)


def _packed_all(c: dict) -> torch.Tensor:
    """A packed custom mask that keeps every key of every query."""
    bits = c["q"].shape[0] * c["k"].shape[0]
    return torch.full(((bits + 7) // 8,), 255, dtype=torch.uint8, device=DEV)


def _single_cases() -> list[Case]:
    out = []
    decode = "flashinfer.decode.single_decode_with_kv_cache"
    variations = [
        Var("base", route=True),
        Var("kv_layout", layout="HND", route=True),
        Var("window_left", run={"window_left": 20}, route=True, jit="window"),
        Var("use_tensor_cores", run={"use_tensor_cores": True}, route=True, jit="tc"),
        Var("q_scale", run={"q_scale": 0.5}),
        *_single_shared_variations("rope_scale"),
    ]
    name = "single_decode_h32_kv8_d128"
    out += _wrapper_cases(decode, name, variations, _single_call(decode, None), "single-decode")
    prefill = "flashinfer.prefill.single_prefill_with_kv_cache"
    variations = [
        Var("base", route=True),
        Var("causal", run={"causal": True}, route=True, jit="causal"),
        # FlashInfer 0.7.2's SM90 (fa3) kernel dies of SIGFPE on an HND cache, and "auto"
        # picks it on an H100: its own call takes fa2 here (the backend is not ruled).
        Var("kv_layout", layout="HND", run={"backend": "fa2"}, route=True, also=("backend",)),
        Var("window_left", run={"causal": True, "window_left": 20}, route=True, jit="window"),
        Var("backend", run={"backend": "fa2"}, route=True),
        Var("o_dtype", run={"o_dtype": BF16}, route=True),
        Var("use_fp16_qk_reduction", run={"use_fp16_qk_reduction": True}, jit="fp16qk"),
        Var(
            "custom_mask",
            run={
                "custom_mask": lambda c: torch.ones(
                    c["q"].shape[0], c["k"].shape[0], dtype=torch.bool, device=DEV
                )
            },
            jit="mask",
        ),
        Var("packed_custom_mask", run={"packed_custom_mask": _packed_all}, jit="mask"),
        Var("scale_q", run={"scale_q": _ones}),
        Var("scale_k", run={"scale_k": _ones}),
        Var("scale_v", run={"scale_v": _ones}),
        Var("kv_cache_sf", run={"kv_cache_sf": _ones}),
        *_single_shared_variations("rope_theta"),
    ]
    name = "single_prefill_h32_kv8_d128"
    out += _wrapper_cases(prefill, name, variations, _single_call(prefill, 9), "single-prefill")
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
    api = "flashinfer.page.append_paged_mla_kv_cache"
    name = "append_paged_mla_kv_cache_ckv512_kpe64"
    for page_size, per_request in ((1, 1), (64, 1), (64, 5)):

        def mla(page_size=page_size, per_request=per_request):
            lay = _paged_layout(9, 3, page_size, kv_heads=1, dim=64)
            lens = (lay["indptr"][1:] - lay["indptr"][:-1] - 1) * page_size + lay["last"]
            # The last `per_request` positions of each request (fewer where it is shorter).
            rows = [
                (b, p)
                for b, n in enumerate(lens.tolist())
                for p in range(max(0, n - per_request), n)
            ]
            batch_indices = torch.tensor([b for b, _ in rows], device=DEV, dtype=torch.int32)
            positions = torch.tensor([p for _, p in rows], device=DEV, dtype=torch.int32)
            ckv = rnd(lay["num_pages"], page_size, 512, seed=10)
            kpe = rnd(lay["num_pages"], page_size, 64, seed=11)
            flashinfer.page.append_paged_mla_kv_cache(
                rnd(len(rows), 512, seed=12),
                rnd(len(rows), 64, seed=13),
                batch_indices,
                positions,
                ckv,
                kpe,
                lay["indices"],
                lay["indptr"],
                lay["last"],
            )
            return (ckv, kpe)

        label = f"{name} page_size={page_size} tokens per request={per_request}"
        out.append(Case(api, label, mla, {name: solution(name)}))
    return out + _nvfp4_page_cases()


def _nvfp4_caches(num_pages, page_size, kv_heads, dim, seed):
    """Random packed NVFP4 K/V pages [pages, page_size, heads, dim / 2] and E4M3 scales."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    shape = (num_pages, page_size, kv_heads)
    k, v = (
        torch.randint(0, 256, (*shape, dim // 2), generator=gen, device=DEV, dtype=torch.uint8)
        for _ in range(2)
    )
    ks, vs = (rnd(*shape, dim // 16, seed=seed + i).abs().to(torch.float8_e4m3fn) for i in (1, 2))
    return k, v, ks, vs


def _nvfp4_page_cases() -> list[Case]:
    """The NVFP4 paged-cache appends: software E2M1 rounding, so they run on SM90."""
    import flashinfer

    out = []
    api = "flashinfer.page.nvfp4_quantize_append_paged_kv_cache"
    for dim, layout, stacked, scales in (
        (128, "NHD", False, (1.0, 1.0)),
        (128, "HND", True, (0.02, 0.5)),
        (64, "NHD", False, (0.25, 3.0)),
    ):
        name = f"nvfp4_quantize_append_paged_kv_cache_kv8_d{dim}_ps16"

        def call(dim=dim, layout=layout, stacked=stacked, scales=scales):
            lay = _paged_layout(21, 3, 16, dim=dim)
            lens = (lay["indptr"][1:] - lay["indptr"][:-1] - 1) * 16 + lay["last"]
            # The last two positions of each sequence.
            rows = [(b, p) for b, n in enumerate(lens.tolist()) for p in range(max(0, n - 2), n)]
            batch_indices = torch.tensor([b for b, _ in rows], device=DEV, dtype=torch.int32)
            positions = torch.tensor([p for _, p in rows], device=DEV, dtype=torch.int32)
            k, v, ks, vs = _nvfp4_caches(lay["num_pages"], 16, 8, dim, seed=22)
            cache, sf = _kv(layout, k, v, stacked), _kv(layout, ks, vs, stacked)
            flashinfer.page.nvfp4_quantize_append_paged_kv_cache(
                rnd(len(rows), 8, dim, seed=23, scale=3.0),
                rnd(len(rows), 8, dim, seed=24),
                batch_indices,
                positions,
                cache,
                sf,
                lay["indices"],
                lay["indptr"],
                lay["last"],
                *scales,
                kv_layout=layout,
            )
            found = (*cache, *sf) if isinstance(cache, tuple) else (cache, sf)
            return tuple(t.view(torch.uint8) for t in found)

        label = f"{name} {layout} {'stacked' if stacked else 'tuple'} scales={scales}"
        out.append(Case(api, label, call, {name: solution(name)}))

    def half():
        k, v, ks, vs = _nvfp4_caches(4, 16, 8, 128, seed=25)
        one = torch.zeros(1, device=DEV, dtype=torch.int32)
        flashinfer.page.nvfp4_quantize_append_paged_kv_cache(
            rnd(1, 8, 128, seed=26, dtype=torch.float16),
            rnd(1, 8, 128, seed=27, dtype=torch.float16),
            one,
            one,
            (k, v),
            (ks, vs),
            one,
            torch.tensor([0, 1], device=DEV, dtype=torch.int32),
            one + 1,
            1.0,
            1.0,
        )
        return (k, v, ks.view(torch.uint8), vs.view(torch.uint8))

    name = "nvfp4_quantize_append_paged_kv_cache_kv8_d128_ps16"
    out.append(Case(api, f"{name} float16 rows", half, {name: solution(name)}, "tensor:append_key"))

    api = "flashinfer.page.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping"
    for dim, layout, scale_kind in ((128, "NHD", "float"), (64, "HND", "tensor")):
        name = f"nvfp4_quantize_append_paged_kv_cache_with_slot_mapping_kv8_d{dim}_ps16"

        def slots(dim=dim, layout=layout, scale_kind=scale_kind):
            k, v, ks, vs = _nvfp4_caches(5, 16, 8, dim, seed=31)
            cache, sf = _kv(layout, k, v, False), _kv(layout, ks, vs, False)
            # Distinct slots, one negative (skipped) and one past the cache; two padding rows.
            mapping = torch.tensor([3, 77, -1, 16, 80, 40, 0], device=DEV, dtype=torch.int32)
            if scale_kind == "tensor":
                scales = (torch.tensor([0.3], device=DEV), torch.tensor([1.7], device=DEV))
            else:
                scales = (0.3, 1.7)
            flashinfer.page.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
                rnd(9, 8, dim, seed=32, scale=2.0),
                rnd(9, 8, dim, seed=33),
                mapping,
                cache,
                sf,
                *scales,
                kv_layout=layout,
            )
            return tuple(t.view(torch.uint8) for t in (*cache, *sf))

        out.append(Case(api, f"{name} {layout} {scale_kind} scales", slots, {name: solution(name)}))

    api = "flashinfer.page.nvfp4_quantize_append_paged_mla_kv_cache"
    name = "nvfp4_quantize_append_paged_mla_kv_cache_ckv512_kpe64"
    for page_size, scales in ((1, (1.0, 1.0)), (64, (0.05, 0.02))):

        def mla(page_size=page_size, scales=scales):
            lay = _paged_layout(41, 3, page_size, kv_heads=1, dim=64)
            lens = (lay["indptr"][1:] - lay["indptr"][:-1] - 1) * page_size + lay["last"]
            rows = [(b, p) for b, n in enumerate(lens.tolist()) for p in range(max(0, n - 3), n)]
            batch_indices = torch.tensor([b for b, _ in rows], device=DEV, dtype=torch.int32)
            positions = torch.tensor([p for _, p in rows], device=DEV, dtype=torch.int32)
            gen = torch.Generator(device=DEV).manual_seed(42)
            n = lay["num_pages"]
            ckv = torch.randint(0, 256, (n, page_size, 256), generator=gen, device=DEV)
            ckv = ckv.to(torch.uint8)
            ckv_sf = rnd(n, page_size, 32, seed=43).abs().to(torch.float8_e4m3fn)
            kpe = rnd(n, page_size, 64, seed=44).to(torch.float8_e4m3fn)
            flashinfer.page.nvfp4_quantize_append_paged_mla_kv_cache(
                rnd(len(rows), 512, seed=45, scale=2.0),
                rnd(len(rows), 64, seed=46, scale=8.0),
                batch_indices,
                positions,
                ckv,
                ckv_sf,
                kpe,
                lay["indices"],
                lay["indptr"],
                lay["last"],
                *scales,
            )
            return (ckv, ckv_sf.view(torch.uint8), kpe.view(torch.uint8))

        label = f"{name} page_size={page_size} scales={scales}"
        out.append(Case(api, label, mla, {name: solution(name)}))
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
    # Out of place, with the rotary width and the pairing as inputs: any is_neox is routed.
    api = "flashinfer.rope.apply_rope_with_cos_sin_cache"
    name = "rope_cos_sin_cache_d128"
    for tokens, neox, rotary in ((1, True, 128), (77, True, 64), (8, False, 64)):

        def fresh(tokens=tokens, neox=neox, rotary=rotary):
            q, k = rnd(tokens, 32 * 128, seed=1), rnd(tokens, 8 * 128, seed=2)
            cache = rnd(4096, rotary, seed=3, dtype=torch.float32)
            pos = torch.randint(0, 4096, (tokens,), device=DEV, generator=g(4))
            r = flashinfer.rope.apply_rope_with_cos_sin_cache(pos, q, k, 128, cache, neox)
            return _results(r) + (q, k)  # and the inputs, which it must leave as they were

        label = f"{name} tokens={tokens} is_neox={neox} rotary_dim={rotary}"
        out.append(Case(api, label, fresh, {name: solution(name)}))
    return out


def _rope_on_the_fly_cases() -> list[Case]:
    """The eight RoPE functions that compute their angles from positions: ragged (indptr and
    offsets) or per-token position ids, plain or Llama 3.1 frequencies, out of place or in
    place; at their defaults and at a non-default value of every scalar."""
    import flashinfer

    out = []
    plain = [
        {},
        {"rotary_dim": 64},
        {"interleave": True},
        {"rope_scale": 2.0, "rope_theta": 5e5},
    ]
    llama = [
        {},
        {"rotary_dim": 64, "interleave": True},
        {"rope_scale": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0},
        {"old_context_len": 4096, "rope_theta": 1e4},
    ]
    for llama31 in (False, True):
        for by_ids in (False, True):
            for in_place in (False, True):
                stem = "apply_llama31_rope" if llama31 else "apply_rope"
                stem += "_pos_ids" if by_ids else ""
                fn = stem + ("_inplace" if in_place else "")
                name = f"{fn.removeprefix('apply_')}_h32_kv8_d128"
                for kw in (llama if llama31 else plain) + ["float16"]:

                    def call(fn=fn, by_ids=by_ids, in_place=in_place, kw=kw):
                        dtype = torch.float16 if kw == "float16" else BF16
                        q, k = rnd(37, 32, 128, seed=51, dtype=dtype), rnd(
                            37, 8, 128, seed=52, dtype=dtype
                        )
                        if by_ids:
                            where = (
                                torch.randint(0, 8192, (37,), device=DEV, generator=g(53)).int(),
                            )
                        else:
                            indptr = torch.tensor([0, 5, 5, 30, 37], device=DEV, dtype=torch.int32)
                            offsets = torch.tensor(
                                [0, 17, 4000, 9000], device=DEV, dtype=torch.int32
                            )
                            where = (indptr, offsets)
                        r = getattr(flashinfer.rope, fn)(
                            q, k, *where, **(kw if kw != "float16" else {})
                        )
                        return (q, k) if in_place else _results(r)

                    given = (
                        "float16 q and k"
                        if kw == "float16"
                        else " ".join(f"{a}={b}" for a, b in kw.items()) or "defaults"
                    )
                    out.append(
                        Case(
                            f"flashinfer.rope.{fn}",
                            f"{name} {given}",
                            call,
                            {name: solution(name)},
                            expect="tensor:q" if kw == "float16" else None,
                            params=tuple(kw) if kw != "float16" else (),
                            variant=f"rope:{fn}:{sorted(kw) if kw != 'float16' else kw}",
                        )
                    )
    return out


def _rope_fp8_cases() -> list[Case]:
    """rope_quantize_fp8: RoPE on the rotary part, both parts scaled and cast to FP8."""
    import flashinfer

    out = []
    api = "flashinfer.rope.rope_quantize_fp8"
    name = "rope_quantize_fp8_h32_kv8_rope128"
    variants = (
        ({}, 0, None),
        ({}, 64, None),
        ({"is_neox": False}, 64, None),
        ({"quant_scale_q": 0.5, "quant_scale_kv": 2.0}, 64, None),
        ({"quantize_dtype": torch.float8_e4m3fn}, 0, None),
        ({"quantize_dtype": torch.float8_e5m2}, 64, "quantize_dtype"),
    )
    for kw, nope, expect in variants:

        def call(kw=kw, nope=nope):
            q, k = rnd(7, 32, 128, seed=71), rnd(7, 8, 128, seed=72)
            qn = rnd(7, 32, nope, seed=73) if nope else None
            kn = rnd(7, 8, nope, seed=74) if nope else None
            cache = rnd(4096, 128, seed=75, dtype=torch.float32)
            pos = torch.randint(0, 4096, (7,), device=DEV, generator=g(76))
            r = flashinfer.rope.rope_quantize_fp8(q, k, qn, kn, cache, pos, **kw)
            return _results(r)

        shown = " ".join(f"{a}={str(b).removeprefix('torch.')}" for a, b in kw.items())
        label = f"{name} no_rope_dim={nope} {shown}".rstrip()
        out.append(Case(api, label, call, {name: solution(name)}, expect=expect))
    return out


def _rope_fp8_more_cases() -> list[Case]:
    """The MLA RoPE-and-quantize, and RoPE-and-quantize with the FP8 paged-cache append."""
    import flashinfer

    out = []
    api = "flashinfer.rope.mla_rope_quantize_fp8"
    for name, nnz in (
        ("mla_rope_quantize_fp8_h128_rope64", 5),
        ("mla_rope_quantize_fp8_h16_rope64", 33),
    ):

        def mla(name=name, nnz=nnz):
            x = _inputs(name, 171, nnz=nnz, no_rope_dim=512, max_seq_len=4096)
            return _results(
                flashinfer.rope.mla_rope_quantize_fp8(
                    x["q_rope"],
                    x["k_rope"],
                    x["q_nope"],
                    x["k_nope"],
                    x["cos_sin_cache"],
                    x["pos_ids"],
                    is_neox=bool(x["is_neox"]),
                    quant_scale_q=float(x["quant_scale_q"]),
                    quant_scale_kv=float(x["quant_scale_kv"]),
                )
            )

        out.append(Case(api, f"{name} nnz={nnz} no_rope_dim=512", mla, {name: solution(name)}))
    api = "flashinfer.rope.rope_quantize_fp8_append_paged_kv_cache"
    for name, rope, nope in (
        ("rope_quantize_fp8_append_paged_kv_cache_h32_kv8_rope128_ps16", 128, 0),
        ("rope_quantize_fp8_append_paged_kv_cache_h8_kv2_rope64_ps16", 64, 64),
    ):

        def append(name=name, nope=nope, rope=rope):
            x = _inputs(
                name,
                181,
                nnz=9,
                no_rope_dim=nope,
                head_dim=rope + nope,
                max_seq_len=4096,
                num_pages=32,
                batch_size_plus_1=4,
                num_kv_indices=6,
            )
            k_cache, v_cache = x["k_cache"], x["v_cache"]
            q_rope_out, q_nope_out = flashinfer.rope.rope_quantize_fp8_append_paged_kv_cache(
                x["q_rope"],
                x["k_rope"],
                x["q_nope"] if nope else None,
                x["k_nope"] if nope else None,
                x["v"],
                x["cos_sin_cache"],
                x["pos_ids"],
                (k_cache, v_cache),
                x["kv_indices"],
                x["kv_indptr"],
                x["batch_indices"],
                x["positions"],
                is_neox=bool(x["is_neox"]),
                quant_scale_q=float(x["quant_scale_q"]),
                quant_scale_kv=float(x["quant_scale_kv"]),
                page_size=16,
            )
            return (q_rope_out, q_nope_out, k_cache, v_cache)

        out.append(Case(api, f"{name} nnz=9 no_rope_dim={nope}", append, {name: solution(name)}))
    return out


def _as_sets(indices: torch.Tensor) -> torch.Tensor:
    """Each row's selected indices in ascending order, then the -1 padding (Note [top-k
    order] in definitions/sampling_transforms.fidef: FlashInfer lists a row's selection in
    no particular order, so a selection is compared as a set)."""
    big = torch.iinfo(indices.dtype).max
    keyed = torch.where(indices < 0, torch.full_like(indices, big), indices)
    ordered = keyed.sort(dim=-1).values
    return torch.where(ordered == big, torch.full_like(ordered, -1), ordered)


def _speculative_and_top_k_cases() -> list[Case]:
    """Chain speculative sampling (compared by the distribution of its tokens and counts),
    and the top-k selections for sparse attention (compared as sets per row)."""
    import flashinfer

    out = []
    # Identical rows of a draft and a target distribution over a few tokens: every row is a
    # draw of the same process, so 2048 rows give each output's distribution.
    vocab, rows, steps = 128256, 2048, 3
    support = torch.tensor([5, 17, 99, 1000, 4242, 70000])

    def spec(name=f"chain_speculative_sampling_v{vocab}"):
        draft = torch.zeros(steps, vocab)
        target = torch.zeros(steps + 1, vocab)
        draft[:, support] = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
        target[:, support] = torch.tensor([0.2, 0.3, 0.1, 0.2, 0.1, 0.1])
        draft_probs = draft.to(DEV).expand(rows, -1, -1).contiguous()
        target_probs = target.to(DEV).expand(rows, -1, -1).contiguous()
        ids = support[torch.tensor([0, 1, 3])].to(torch.int32).to(DEV).expand(rows, -1)
        torch.manual_seed(0)
        return _results(
            flashinfer.sampling.chain_speculative_sampling(
                draft_probs, ids.contiguous(), target_probs
            )
        )

    name = f"chain_speculative_sampling_v{vocab}"
    out.append(
        Case(
            "flashinfer.sampling.chain_speculative_sampling",
            f"{name} rows={rows} num_speculative={steps}",
            spec,
            {name: solution(name)},
            samples=True,
        )
    )
    for name, ps in (
        ("top_k_page_table_transform_k2048_ps1", 1),
        ("top_k_page_table_transform_k2048_ps64", 64),
    ):

        def paged(name=name, ps=ps):
            x = _inputs(
                name, 191, num_rows=6, max_len=6000, batch_size=6, max_pages_per_seq=6000 // ps + 1
            )
            return (
                _as_sets(
                    flashinfer.topk.top_k_page_table_transform(
                        x["input"],
                        x["src_page_table"],
                        x["lengths"],
                        2048,
                        row_to_batch=x["row_to_batch"],
                        page_size=ps,
                    )
                ),
            )

        out.append(
            Case(
                "flashinfer.topk.top_k_page_table_transform",
                f"{name} rows=6 max_len=6000",
                paged,
                {name: solution(name)},
                variant="topk",
            )
        )
    name = "top_k_ragged_transform_k2048"

    def ragged(name=name):
        x = _inputs(name, 193, num_rows=5, max_len=9000)
        return (
            _as_sets(
                flashinfer.topk.top_k_ragged_transform(x["input"], x["offsets"], x["lengths"], 2048)
            ),
        )

    out.append(
        Case(
            "flashinfer.topk.top_k_ragged_transform",
            f"{name} rows=5 max_len=9000",
            ragged,
            {name: solution(name)},
            variant="topk",
        )
    )
    for name, k, batch in (
        ("top_k_varlen_n8192_k512", 512, 7),
        ("top_k_varlen_n131072_k2048", 2048, 3),
    ):

        def varlen(name=name, k=k, batch=batch):
            from flashinfer.topk_varlen.topk_varlen import top_k_varlen

            x = _inputs(name, 197, batch_size=batch)
            result = top_k_varlen(x["logits"], x["seq_lens"], k)
            indices = result[0] if isinstance(result, tuple) else result
            return (_as_sets(indices),)

        out.append(
            Case(
                "flashinfer.topk_varlen.topk_varlen.top_k_varlen",
                f"{name} batch={batch}",
                varlen,
                {name: solution(name)},
                variant="topk_varlen",
            )
        )
    return out


def _bmm_fp8_cases() -> list[Case]:
    """bmm_fp8 through cuBLAS: per-tensor scaled FP8, B column-major per batch entry."""
    import flashinfer

    out = []
    for name, n, k, batch, m in (
        ("bmm_fp8_N512_K128", 512, 128, 16, 9),
        ("bmm_fp8_N128_K512", 128, 512, 8, 33),
    ):

        def bmm(n=n, k=k, batch=batch, m=m):
            a = rnd(batch, m, k, seed=201).to(torch.float8_e4m3fn)
            b = rnd(batch, n, k, seed=202).to(torch.float8_e4m3fn).transpose(-2, -1)
            # Scales near one keep the products near one, where the tolerance bites.
            a_scale = torch.tensor([0.5], device=DEV)
            b_scale = torch.tensor([0.25], device=DEV)
            return (flashinfer.gemm.bmm_fp8(a, b, a_scale, b_scale, torch.bfloat16),)

        out.append(
            Case(
                "flashinfer.gemm.bmm_fp8",
                f"{name} batch={batch} M={m}",
                bmm,
                {name: solution(name)},
            )
        )
    return out


def _sm90_more_cases() -> list[Case]:
    """More entry points that run on SM90: the NVFP4 paged-KV dequantize, the DeepSeek router
    GEMMs, the segment GEMM, and FlashInfer's SM90 paths of AlphaMoE's weight interleave, the
    fused GDN decode step and the MLA KV concat-and-quantize (in PyTorch there: their fused
    kernels are for SM100 or SM120); and an ``mm_fp8`` on cuBLAS, which must fall back."""
    import flashinfer
    import flashinfer.fused_moe
    import flashinfer.mla_kv_pack

    out = []

    def case(api, label, call, name, expect=None, variant=None):
        out.append(Case(api, label, call, {name: solution(name)}, expect=expect, variant=variant))

    for name, batch in (
        ("nvfp4_kv_dequantize_paged_h8_dk128_dv128_ps16", 3),
        ("nvfp4_kv_dequantize_paged_h8_dk64_dv64_ps16", 5),
    ):

        def dequant(name=name, batch=batch):
            x = _inputs(
                name, 211, batch_size=batch, max_seq_len=40, num_pages=12, block_table_stride=3
            )
            k, v = x["output_k"], x["output_v"]
            flashinfer.quantization.fp4_quantization.nvfp4_kv_dequantize_paged(
                (x["paged_k_cache"].view(torch.uint8), x["paged_v_cache"].view(torch.uint8)),
                (x["k_scales"], x["v_scales"]),
                x["block_tables"],
                x["seq_lens"],
                x["k_scale"],
                x["v_scale"],
                k,
                v,
            )
            return (k, v)

        case(
            "flashinfer.quantization.fp4_quantization.nvfp4_kv_dequantize_paged",
            f"{name} batch={batch} max_seq_len=40",
            dequant,
            name,
        )
    for k in (6144, 7168):
        name = f"mm_M1_16_K{k}_N256_k{k}_n256"
        for m in (1, 16):

            def router(k=k, m=m):
                a = rnd(m, k, seed=221)
                b = rnd(256, k, seed=222).t()  # the [N, K] weight, column-major [K, N]
                c = torch.empty(m, 256, dtype=torch.float32, device=DEV)
                getattr(flashinfer.gemm, f"mm_M1_16_K{k}_N256")(a, b, c)
                return (c,)

            case(f"flashinfer.gemm.mm_M1_16_K{k}_N256", f"{name} M={m}", router, name)
    name = "segment_gemm_run_k4096_n64"
    for column_major, by_lens in ((False, False), (True, True)):

        def segments(column_major=column_major, by_lens=by_lens):
            x = rnd(40, 4096, seed=231)
            w = rnd(4, 64, 4096, seed=232) if column_major else rnd(4, 4096, 64, seed=232)
            lens = torch.tensor([7, 0, 33], device=DEV)
            indptr = torch.cat([lens.new_zeros(1), lens.cumsum(0)])
            which = torch.tensor([2, 0, 3], device=DEV)
            workspace = torch.empty(32 * 1024 * 1024, dtype=torch.int8, device=DEV)
            wrapper = flashinfer.gemm.SegmentGEMMWrapper(workspace)
            kw = {"seg_lens": lens} if by_lens else {"seg_indptr": indptr}
            return (wrapper.run(x, w, 3, column_major, weight_indices=which, **kw),)

        case(
            "flashinfer.gemm.SegmentGEMMWrapper.run",
            f"{name} segments=7,0,33 column_major={column_major}"
            + (" seg_lens" if by_lens else " seg_indptr"),
            segments,
            name,
            variant="segment_gemm",
        )
    for name, experts in (
        ("alphamoe_interleave_gated_weights_h256_i128", 3),
        ("alphamoe_interleave_gated_weights_h2048_i768", 2),
    ):

        def alpha(name=name, experts=experts):
            x = _inputs(name, 241, num_experts=experts)
            return _results(
                flashinfer.fused_moe.alphamoe_interleave_gated_weights(
                    x["gemm1_weights"], x["gemm1_weights_scale"]
                )
            )

        case(
            "flashinfer.fused_moe.alphamoe_interleave_gated_weights",
            f"{name} experts={experts}",
            alpha,
            name,
        )
    name = "gdn_fused_decode_h2048_v16_d128"

    def gdn_step(name=name):
        from flashinfer.gdn_kernels.experimental.gdn_fused_decode import gdn_fused_decode_step

        x = _inputs(name, 251, batch_size=3, num_pages=8)
        return _results(
            gdn_fused_decode_step(
                x["hidden_states"],
                x["w_ba"],
                x["mixed_qkv"],
                x["conv_weight"],
                x["conv_bias"],
                x["conv_state"],
                x["A_log"],
                x["dt_bias"],
                float(x["scale"]),
                x["ssm_state"],
                x["state_indices"],
            )
        )

    case(
        "flashinfer.gdn_kernels.experimental.gdn_fused_decode.gdn_fused_decode_step",
        f"{name} batch=3 pages=8",
        gdn_step,
        name,
    )
    name = "concat_mla_kv_quant_fp8_h16_kv256_rope64"
    for tokens in (1, 37):

        def concat(name=name, tokens=tokens):
            x = _inputs(name, 261, num_tokens=tokens)
            return _results(flashinfer.mla_kv_pack.concat_mla_kv_quant_fp8(x["kv_nope"], x["k_pe"]))

        case(
            "flashinfer.mla_kv_pack.concat_mla_kv_quant_fp8",
            f"{name} tokens={tokens}",
            concat,
            name,
        )
    # Note [blockscale input scales] (definitions/gemm_fp8.fidef): the kernel reads the
    # per-token scales M-major, M padded to a multiple of 4; the row-major tensor its
    # docstring names must fall back.
    name = "fp8_blockscale_gemm_sm90_n2112_k7168"
    for m, aligned in ((1, True), (5, True), (77, True), (128, True), (5, False)):

        def blockscale(name=name, m=m, aligned=aligned):
            x = _inputs(name, 281, M=m)
            scale = x["input_scale"]
            if aligned:
                padded = scale.new_zeros(scale.shape[1], (m + 3) // 4 * 4)
                padded[:, :m] = scale.T
                scale = padded.T[:m]
            return (
                flashinfer.gemm.fp8_blockscale_gemm_sm90(
                    x["input"], x["weight"], scale, x["weight_scale"]
                ),
            )

        case(
            "flashinfer.gemm.fp8_blockscale_gemm_sm90",
            f"{name} M={m} input_scale " + ("M-major aligned" if aligned else "row-major"),
            blockscale,
            name,
            expect=None if aligned else "input_scale",
            variant="fp8_blockscale",
        )
    name = "gemm_fp8_per_tensor_N4096_K4096"

    def cublas_fp8():
        a = rnd(9, 4096, seed=271).to(torch.float8_e4m3fn)
        b = rnd(4096, 4096, seed=272).to(torch.float8_e4m3fn)
        alpha = torch.tensor(0.01, device=DEV)
        return (flashinfer.gemm.mm_fp8(a, b, alpha, backend="cublas"),)

    # The plain [N, K] weight of the per-tensor GEMMs (cuBLAS here); the shuffled block
    # weight of the low-latency kernel is SM100's.
    case("flashinfer.gemm.mm_fp8", f"{name} M=9 backend=cublas", cublas_fp8, name)
    return out


def _basic_more_cases() -> list[Case]:
    """gelu_tanh_and_mul, the Gemma fused add-norm, the fused RMSNorm-SiLU, and the bf16
    GEMMs (mm, bmm, tinygemm)."""
    import flashinfer

    out = []

    def case(api, label, call, name, expect=None):
        out.append(Case(api, label, call, {name: solution(name)}, expect=expect))

    name = "gelu_tanh_and_mul_h14336_bf16"
    for rows in (1, 77):
        case(
            "flashinfer.activation.gelu_tanh_and_mul",
            f"{name} rows={rows}",
            lambda rows=rows: (flashinfer.activation.gelu_tanh_and_mul(rnd(rows, 28672, seed=1)),),
            name,
        )

    def gemma(rows):
        x, r, w = rnd(rows, 2304, seed=1), rnd(rows, 2304, seed=2), rnd(2304, seed=3)
        flashinfer.norm.gemma_fused_add_rmsnorm(x, r, w, 1e-6)
        return (x, r)

    name = "gemma_fused_add_rmsnorm_h2304"
    for rows in (1, 64):
        case(
            "flashinfer.norm.gemma_fused_add_rmsnorm",
            f"{name} rows={rows}",
            lambda rows=rows: gemma(rows),
            name,
        )

    name = "fused_rmsnorm_silu_h512"
    api = "flashinfer.norm.fused_rmsnorm_silu"
    case(
        api,
        f"{name} rows=33",
        lambda: (flashinfer.norm.fused_rmsnorm_silu(rnd(33, 512, seed=1), rnd(512, seed=2)),),
        name,
    )

    def mm(rows, **kw):
        a, w = rnd(rows, 7168, seed=4), rnd(256, 7168, seed=5)
        return (flashinfer.gemm.mm_bf16(a, w.t(), **kw),)

    name = "gemm_bf16_N256_K7168"
    for rows, kw in ((1, {}), (100, {}), (100, {"out_dtype": torch.float16})):
        expect = "out_dtype" if kw else None
        case(
            "flashinfer.gemm.mm_bf16",
            f"{name} M={rows}" + (" out_dtype=float16" if kw else ""),
            lambda rows=rows, kw=kw: mm(rows, **kw),
            name,
            expect,
        )

    # On SM90 only the cuDNN backend runs these products (FlashInfer refuses "cutlass" and
    # "tgv" there); it needs the nvidia-cudnn-frontend package.
    name = "bmm_bf16_N512_K128"
    case(
        "flashinfer.gemm.bmm_bf16",
        f"{name} batch=16 M=5",
        lambda: (flashinfer.gemm.bmm_bf16(rnd(16, 5, 128, seed=6), rnd(16, 128, 512, seed=7)),),
        name,
    )

    def tiny(bias):
        x, w = rnd(4, 2880, seed=8), rnd(128, 2880, seed=9)
        o = torch.empty(4, 128, device=DEV, dtype=BF16)
        b = rnd(128, seed=10) if bias else None
        flashinfer.gemm.tinygemm_bf16(x, w, o, b)
        return (o,)

    name = "tinygemm_bf16_n128_k2880"
    for bias in (False, True):
        case(
            "flashinfer.gemm.tinygemm_bf16",
            f"{name} M=4 bias={bias}",
            lambda bias=bias: tiny(bias),
            name,
        )
    return out


def _norm_quant_cases() -> list[Case]:
    """The FP8-quantizing norms (a bfloat16 `out` refused) and concat_mla_k."""
    import flashinfer

    out = []
    fp8 = torch.float8_e4m3fn

    def quant(rows, scale, out_dtype, with_residual=False, layer=False):
        x = rnd(rows, 2048 if not layer else 768, seed=1)
        h = x.shape[1]
        o = torch.empty(rows, h, device=DEV, dtype=out_dtype)
        s = torch.tensor([scale], device=DEV)
        if layer:
            g_, b_ = rnd(h, seed=2, dtype=torch.float32), rnd(h, seed=3, dtype=torch.float32)
            flashinfer.norm.layernorm_quant(o, x, g_, b_, s, 1e-6)
            return (o,)
        w = rnd(h, seed=2)
        if with_residual:
            r = rnd(rows, h, seed=3)
            flashinfer.norm.fused_add_rmsnorm_quant(o, x, r, w, s, 1e-6)
            return (o, r)
        flashinfer.norm.rmsnorm_quant(o, x, w, s, 1e-6)
        return (o,)

    for api, name, extra in (
        ("flashinfer.norm.rmsnorm_quant", "rmsnorm_quant_h2048", {}),
        (
            "flashinfer.norm.fused_add_rmsnorm_quant",
            "fused_add_rmsnorm_quant_h2048",
            {"with_residual": True},
        ),
        ("flashinfer.norm.layernorm_quant", "layernorm_quant_h768", {"layer": True}),
    ):
        for rows, scale, out_dtype, expect in (
            (1, 0.75, fp8, None),
            (64, 1.5, fp8, None),
            (8, 1.5, BF16, "tensor:out"),  # Note [output buffers]
        ):

            def call(rows=rows, scale=scale, out_dtype=out_dtype, extra=extra):
                return quant(rows, scale, out_dtype, **extra)

            label = f"{name} rows={rows} scale={scale} out={str(out_dtype).removeprefix('torch.')}"
            out.append(Case(api, label, call, {name: solution(name)}, expect=expect))

    # FlashInfer's kernel takes 128 heads only (it raises for the 16 of a TP-8 shard, which
    # apply routes to its solution).
    name = "concat_mla_k_h128_nope128_rope64_d192"
    for tokens in (1, 300):

        def concat(tokens=tokens):
            k = torch.empty(tokens, 128, 192, device=DEV, dtype=BF16)
            flashinfer.concat_ops.concat_mla_k(
                k, rnd(tokens, 128, 128, seed=4), rnd(tokens, 1, 64, seed=5)
            )
            return (k,)

        out.append(
            Case(
                "flashinfer.concat_ops.concat_mla_k",
                f"{name} tokens={tokens}",
                concat,
                {name: solution(name)},
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
    support = [5, 17, 99, 1000, 4242, 70000, 128000, 3]
    weights = [0.3, 0.2, 0.15, 0.12, 0.09, 0.07, 0.05, 0.02]

    def probs(floor):
        # A small tail of distinct values under every token, as a softmax leaves one:
        # FlashInfer's top_k_top_p sampler did not return within minutes on rows of exact
        # zeros, nor on a tail of one repeated value (H100, 0.7.2).
        p = floor * (1 + torch.rand(rows, vocab, device=DEV, generator=g(41)))
        p[:, torch.tensor(support, device=DEV)] = torch.tensor(weights, device=DEV)
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


def _sampling_more_cases() -> list[Case]:
    """Softmax and the renorm and mask transforms (compared value by value), and the plain,
    min-p and from-logits samplers (compared by the distribution of their draws)."""
    import flashinfer

    vocab, out = 128256, []
    support = [5, 17, 99, 1000, 4242, 70000, 128000, 3]
    weights = [0.3, 0.2, 0.15, 0.12, 0.09, 0.07, 0.05, 0.02]

    def probs(rows=2048, floor=0.0):
        p = floor * (1 + torch.rand(rows, vocab, device=DEV, generator=g(61)))
        p[:, torch.tensor(support, device=DEV)] = torch.tensor(weights, device=DEV)
        return p / p.sum(-1, keepdim=True)

    def logits(rows=16):
        return torch.randn(rows, vocab, device=DEV, generator=g(62)) * 2

    transforms = (
        ("softmax", lambda: (logits(),), {}),
        ("softmax", lambda: (logits(),), {"temperature": 0.7}),
        ("softmax", lambda: (logits(),), {"temperature": torch.full((16,), 1.3, device=DEV)}),
        ("top_k_mask_logits", lambda: (logits(),), {"top_k": 50}),
        ("top_k_renorm_probs", lambda: (torch.softmax(logits(), -1),), {"top_k": 50}),
        ("top_p_renorm_probs", lambda: (probs(16),), {"top_p": 0.7}),
    )
    for fn, args, kw in transforms:
        name = f"{fn}_v{vocab}"

        def call(fn=fn, args=args, kw=kw):
            return _results(getattr(flashinfer.sampling, fn)(*args(), **kw))

        shown = {k: (v if not torch.is_tensor(v) else "<tensor>") for k, v in kw.items()}
        out.append(
            Case(f"flashinfer.sampling.{fn}", f"{name} {shown}", call, {name: solution(name)})
        )
    # Logits whose softmax is the distribution above, for the from-logits samplers.
    as_logits = lambda: torch.log(probs(floor=1e-9))  # noqa: E731
    samplers = (
        ("sampling_from_probs", "sampling_from_probs", lambda: (probs(),), {}),
        ("sampling_from_logits", "sampling_from_logits", lambda: (as_logits(),), {}),
        ("min_p_sampling_from_probs", "min_p_sampling", lambda: (probs(),), {"min_p": 0.3}),
        (
            "top_k_top_p_sampling_from_logits",
            "top_k_top_p_sampling_from_logits",
            lambda: (as_logits(),),
            {"top_k": 5, "top_p": 0.8},
        ),
    )
    for fn, stem, args, kw in samplers:
        name = f"{stem}_v{vocab}"

        def call(fn=fn, args=args, kw=kw):
            torch.manual_seed(0)
            return getattr(flashinfer.sampling, fn)(*args(), **kw)

        out.append(
            Case(
                f"flashinfer.sampling.{fn}",
                f"{name} {kw}",
                call,
                {name: solution(name)},
                samples=True,
            )
        )
    return out


# ---------------------------------------------------------------------------------------
# The wrappers: one case per non-default value of a ruled parameter
# ---------------------------------------------------------------------------------------


@dataclass
class Var:
    """One departure from a wrapper's base call: the parameter it gives, and its value.

    ``param`` is named as the rules name it (``plan.window_left``, ``q_scale``). Values may
    be callables of the call's context (its tensors), evaluated inside the call. ``route``:
    the definition's rules accept the value and the call must be routed; otherwise it must
    fall back by the rule on ``param`` (or ``expect``, where the call fails an earlier one).
    ``jit`` names the FlashInfer kernel variant the call needs, so that ``--prebuild``
    builds each variant once.
    """

    param: str
    plan: dict = field(default_factory=dict)
    run: dict = field(default_factory=dict)
    plan_args: tuple = ()
    run_args: tuple = ()
    route: bool = False
    expect: str | None = None
    dtypes: tuple[torch.dtype, torch.dtype] | None = None  # (q, kv) tensors
    layout: str = "NHD"
    stacked: bool = False
    q_rows: int | None = None  # queries of another count than the plan's
    v_dim: int | None = None  # value head size other than the key's
    jit: str = "base"
    also: tuple[str, ...] = ()  # other parameters the departure gives


def _value(v: Any, ctx: dict) -> Any:
    return v(ctx) if callable(v) and not isinstance(v, (torch.dtype, type)) else v


def _values(d: dict, ctx: dict) -> dict:
    return {k: _value(v, ctx) for k, v in d.items()}


def _short(v: Any) -> str:
    if callable(v) and not isinstance(v, (torch.dtype, type)):
        return "<tensor>"
    text = str(v).removeprefix("torch.")
    return text if len(text) <= 24 else text[:21] + "..."


def _label(var: Var) -> str:
    given = {**{f"plan.{k}": v for k, v in var.plan.items()}, **var.run}
    parts = [f"{k}={_short(v)}" for k, v in given.items()]
    parts += [f"+{len(var.plan_args)} plan positional"] if var.plan_args else []
    parts += [f"+{len(var.run_args)} run positional"] if var.run_args else []
    parts += [f"layout={var.layout}"] if var.layout != "NHD" else []
    parts += ["stacked"] if var.stacked else []
    parts += [f"{var.q_rows}x queries"] if var.q_rows else []
    parts += [f"v_dim={var.v_dim}"] if var.v_dim else []
    return " ".join(parts) or var.param


def rule_of(family: str, param: str) -> str:
    """How stats names the rule a call giving ``param`` a refused value fails."""
    from fibgen.compiler import ir, rules

    fam = FAMILIES[family]
    sc = rules.scope(fam, frozenset())
    for r in fam.rules:
        if isinstance(r, ir.Keywords) and r.target == param:
            return r.target
        if isinstance(r, ir.Require) and param in {x.name for x in rules.refs(r.expr.text, sc)}:
            return rules.rule_name(r, sc)
    raise KeyError(f"no rule of {family} names {param}")


def ruled_parameters(family: str) -> set[str]:
    """The parameters with a default (and keywords of ``**kwargs``) that rules hold."""
    from fibgen.compiler import ir, rules

    fam = FAMILIES[family]
    sc = rules.scope(fam, frozenset())
    optional = {
        prefix + p.name
        for sig, prefix in ((fam.api, ""), (fam.plan, "plan."))
        if sig is not None
        for p in sig.params
        if p.default is not None or p.kind in ("var_positional", "var_keyword")
    }
    named: set[str] = set()
    for r in fam.rules:
        if isinstance(r, ir.Require):
            named |= {x.name for x in rules.refs(r.expr.text, sc)}
        elif isinstance(r, ir.Ignore):
            named |= set(r.names)
        elif isinstance(r, ir.Keywords):
            named.add(r.target)
            optional |= {f"{r.target.split('.')[0]}.{p.name}" for p in r.params}
            named |= {f"{r.target.split('.')[0]}.{p.name}" for p in r.params}
        else:
            named.add(r.target)
    return named & optional


def _wrapper_cases(
    api: str,
    name: str,
    variations: list[Var],
    call_of: Callable[[Var], Callable[[], tuple]],
    group: str,
) -> list[Case]:
    family = CATALOGUE[name][1].name
    out = []
    for var in variations:
        expect = None if var.route else (var.expect or rule_of(family, var.param))
        out.append(
            Case(
                api,
                f"{name} {_label(var)}",
                call_of(var),
                {name: solution(name, family)},
                expect=expect,
                params=(var.param, *var.also),
                variant=f"{group}:{var.jit}",
            )
        )
    return out


def _decode_wrapper(layout="NHD"):
    import flashinfer

    ws = _workspace()
    return flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper(ws, kv_layout=layout)


def _block_tables(lay: dict) -> torch.Tensor:
    indptr, indices = lay["indptr"].cpu(), lay["indices"].cpu()
    pages = indptr[1:] - indptr[:-1]
    table = torch.zeros(len(pages), int(pages.max()), dtype=torch.int32)
    for b in range(len(pages)):
        table[b, : pages[b]] = indices[indptr[b] : indptr[b + 1]]
    return table.to(DEV)


def _kv_lens(lay: dict, page_size: int) -> torch.Tensor:
    pages = lay["indptr"][1:] - lay["indptr"][:-1]
    return ((pages - 1) * page_size + lay["last"]).to(torch.int32)


F32, F16, BF16, FP8 = torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn


def _decode_variations() -> list[Var]:
    V = Var
    return [
        V("paged_kv_cache", layout="HND", stacked=True, route=True),
        V("args", run_args=(0,)),
        V("q_scale", run={"q_scale": 0.5}),
        V("k_scale", run={"k_scale": 0.5}),
        V("v_scale", run={"v_scale": 0.5}),
        V("out", run={"out": lambda c: torch.empty_like(c["q"])}, route=True),
        V(
            "lse",
            run={"lse": lambda c: torch.empty(c["q"].shape[:2], device=DEV), "return_lse": True},
            route=True,
            also=("return_lse",),
        ),
        V("enable_pdl", run={"enable_pdl": True}, route=True),
        V("window_left", run={"window_left": -1}, route=True),
        V("sinks", run={"sinks": lambda c: torch.zeros(32, dtype=F32, device=DEV)}, jit="sinks"),
        V("q_len_per_req", run={"q_len_per_req": 1}, route=True),
        V("skip_softmax_threshold_scale_factor", run={"skip_softmax_threshold_scale_factor": 1.0}),
        V("kv_cache_sf", run={"kv_cache_sf": lambda c: (c["k"][..., :8], c["v"][..., :8])}),
        # More queries than sequences: q's batch axis is not kv_last_page_len's, the first
        # check the call fails (before the rule on q and plan.indptr).
        V("q", q_rows=2, expect="tensor:kv_last_page_len"),
        V("plan.kwargs", plan={"some_future_option": 1}),
        V("plan.deprecated_positional_args", plan_args=("NONE",)),
        V("plan.pos_encoding_mode", plan={"pos_encoding_mode": "ROPE_LLAMA"}, jit="rope"),
        V("plan.window_left", plan={"window_left": 32}, jit="window"),
        V("plan.window_right", plan={"window_right": -1}, route=True),
        V("plan.logits_soft_cap", plan={"logits_soft_cap": 30.0}, jit="softcap"),
        V("plan.q_data_type", plan={"q_data_type": F16}, dtypes=(F16, F16), jit="fp16"),
        V("plan.kv_data_type", plan={"kv_data_type": FP8}, dtypes=(BF16, FP8), jit="fp8"),
        V("plan.data_type", plan={"data_type": F16}, dtypes=(BF16, F16), jit="kv16"),
        V("plan.o_data_type", plan={"o_data_type": F16}, jit="o16"),
        V("plan.sm_scale", plan={"sm_scale": 0.05}, route=True),
        V("plan.rope_scale", plan={"rope_scale": 2.0}, route=True),
        V("plan.rope_theta", plan={"rope_theta": 5e5}, route=True),
        V("plan.non_blocking", plan={"non_blocking": False}, route=True),
        V("plan.block_tables", plan={"block_tables": lambda c: _block_tables(c["lay"])}),
        V("plan.seq_lens", plan={"seq_lens": lambda c: _kv_lens(c["lay"], c["ps"])}),
        V("plan.fixed_split_size", plan={"fixed_split_size": 4}, route=True),
        V("plan.disable_split_kv", plan={"disable_split_kv": True}, route=True),
        V("plan.q_len_per_req", plan={"q_len_per_req": 2}, q_rows=2),
        V("plan.is_causal", plan={"is_causal": False}, route=True),
    ]


def _decode_call(var: Var, ps: int = 64, batch: int = 4) -> Callable[[], tuple]:
    def call() -> tuple:
        lay = _paged_layout(11, batch, ps)
        q_dtype, kv_dtype = var.dtypes or (BF16, BF16)
        lay["k"], lay["v"] = lay["k"].to(kv_dtype), lay["v"].to(kv_dtype)
        q = rnd(batch * (var.q_rows or 1), 32, 128, seed=12, dtype=q_dtype)
        ctx = {"lay": lay, "ps": ps, "q": q, "k": lay["k"], "v": lay["v"]}
        wrapper = _decode_wrapper(var.layout)
        kw = {"q_data_type": BF16, **_values(var.plan, ctx)}
        wrapper.plan(
            lay["indptr"], lay["indices"], lay["last"], 32, 8, 128, ps, *var.plan_args, **kw
        )
        cache = _kv(var.layout, lay["k"], lay["v"], var.stacked)
        return _results(wrapper.run(q, cache, *var.run_args, **_values(var.run, ctx)))

    return call


def _decode_cases() -> list[Case]:
    api = "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run"
    out = []
    # Several sizes and page sizes, the partial last pages of page size 64 included.
    for ps, batch in ((1, 8), (64, 1), (64, 16), (16, 4)):
        name = f"gqa_paged_decode_h32_kv8_d128_ps{ps}"
        family = "gqa_paged_decode_full_pages" if ps == 1 else "gqa_paged_decode"
        var = Var("base", route=True)
        out.append(
            Case(
                api,
                f"{name} batch={batch}" + (" (named by rule)" if ps == 16 else ""),
                _decode_call(var, ps, batch),
                {name: solution(name, family)},
                variant="decode:base",
            )
        )
    name = "gqa_paged_decode_h32_kv8_d128_ps64"
    out += _wrapper_cases(api, name, _decode_variations(), _decode_call, "decode")
    return out


def _prefill_wrapper(layout="NHD"):
    import flashinfer

    ws = _workspace()
    return flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper(ws, kv_layout=layout)


def _mask(q_lens: torch.Tensor, kv_lens: torch.Tensor) -> torch.Tensor:
    """A causal mask, flattened per sequence, as FlashInfer's custom_mask takes it."""
    parts = []
    for ql, kl in zip(q_lens.tolist(), kv_lens.tolist()):
        rows = torch.arange(ql)[:, None] + (kl - ql)
        parts.append((torch.arange(kl)[None, :] <= rows).flatten())
    return torch.cat(parts).to(DEV)


def _packed_mask(q_lens: torch.Tensor, kv_lens: torch.Tensor) -> torch.Tensor:
    """``_mask`` packed 8 to a byte, little bit order, as flashinfer.packbits packs it."""
    bits = _mask(q_lens, kv_lens)
    bits = torch.cat([bits, bits.new_zeros(-len(bits) % 8)]).view(-1, 8).to(torch.uint8)
    return (bits << torch.arange(8, dtype=torch.uint8, device=bits.device)).sum(-1).to(torch.uint8)


def _prefill_common_variations(ragged: bool) -> list[Var]:
    """Departures the paged and ragged prefill wrappers share (their plans and runs)."""
    V = Var
    lens = (lambda c: c["q_lens"], lambda c: c["kv_lens"])
    out = [
        V("args", run_args=(0,)),
        V("q_scale", run={"q_scale": 0.5}),
        V("k_scale", run={"k_scale": 0.5}),
        V("v_scale", run={"v_scale": 0.5}),
        V("out", run={"out": lambda c: torch.empty_like(c["q"])}, route=True),
        V(
            "lse",
            run={"lse": lambda c: torch.empty(c["q"].shape[:2], device=DEV), "return_lse": True},
            route=True,
            also=("return_lse",),
        ),
        V("lse_base", run={"lse_base": "ln", "return_lse": True}),
        V("lse_layout", run={"lse_layout": "HN", "return_lse": True}),
        V("enable_pdl", run={"enable_pdl": True}, route=True),
        V("kv_cache_sf", run={"kv_cache_sf": lambda c: c["k"][..., :8]}),
        V("plan.custom_mask", plan={"custom_mask": lambda c: _mask(c["q_lens"], c["kv_lens"])}),
        V(
            "plan.packed_custom_mask",
            plan={"packed_custom_mask": lambda c: _packed_mask(c["q_lens"], c["kv_lens"])},
        ),
        V("plan.causal", plan={"causal": False}),
        V("plan.pos_encoding_mode", plan={"pos_encoding_mode": "ROPE_LLAMA"}, jit="rope"),
        V("plan.use_fp16_qk_reduction", plan={"use_fp16_qk_reduction": True}, jit="fp16qk"),
        V("plan.sm_scale", plan={"sm_scale": 0.05}, route=True),
        V("plan.window_left", plan={"window_left": 32}, jit="window"),
        V("plan.logits_soft_cap", plan={"logits_soft_cap": 30.0}, jit="softcap"),
        V("plan.rope_scale", plan={"rope_scale": 2.0}, route=True),
        V("plan.rope_theta", plan={"rope_theta": 5e5}, route=True),
        V("plan.q_data_type", plan={"q_data_type": F16}, dtypes=(F16, F16), jit="fp16"),
        V("plan.kv_data_type", plan={"kv_data_type": FP8}, dtypes=(BF16, FP8), jit="fp8"),
        V("plan.o_data_type", plan={"o_data_type": F16}, jit="o16"),
        V("plan.non_blocking", plan={"non_blocking": False}, route=True),
        V("plan.prefix_len_ptr", plan={"prefix_len_ptr": lambda c: c["kv_lens"] - c["q_lens"]}),
        V(
            "plan.token_pos_in_items_ptr",
            plan={"token_pos_in_items_ptr": lambda c: torch.zeros(8, dtype=torch.uint16)},
        ),
        V("plan.token_pos_in_items_len", plan={"token_pos_in_items_len": 8}),
        V("plan.max_item_len_ptr", plan={"max_item_len_ptr": lambda c: c["q_lens"].to(DEV)}),
        V("plan.seq_lens", plan={"seq_lens": lens[1]}),
        V("plan.seq_lens_q", plan={"seq_lens_q": lens[0]}),
        V("plan.max_token_per_sequence", plan={"max_token_per_sequence": 64}),
        V("plan.max_sequence_kv", plan={"max_sequence_kv": 4096}),
        V("plan.fixed_split_size", plan={"fixed_split_size": 64}, route=True),
        V("plan.disable_split_kv", plan={"disable_split_kv": True}, route=True),
        V("plan.uniform_q_len", plan={"uniform_q_len": 3}),
        V("plan.head_dim_vo", plan={"head_dim_vo": 64}, v_dim=64, jit="vo64"),
    ]
    if ragged:
        out += [
            V("o_scale", run={"o_scale": 2.0}),
            V("plan.v_indptr", plan={"v_indptr": lambda c: c["kv_indptr"]}),
            V("plan.o_indptr", plan={"o_indptr": lambda c: c["qo_indptr"]}),
            V("k", layout="HND", route=True, also=("v",)),
        ]
    else:
        out += [
            V("paged_kv_cache", layout="HND", stacked=True, route=True),
            V("window_left", run={"window_left": -1}, route=True),
            V("sinks", run={"sinks": lambda c: torch.zeros(32, dtype=F32, device=DEV)}),
            V(
                "skip_softmax_threshold_scale_factor",
                run={"skip_softmax_threshold_scale_factor": 1.0},
            ),
            V("use_fp16_softmax", run={"use_fp16_softmax": True}),
            V("uses_spcompress", run={"uses_spcompress": True}),
            V("plan.block_tables", plan={"block_tables": lambda c: _block_tables(c["lay"])}),
        ]
    return out


def _paged_prefill_call(var: Var, ps: int = 64, batch: int = 3) -> Callable[[], tuple]:
    def call() -> tuple:
        lay = _paged_layout(21, batch, ps)
        q_dtype, kv_dtype = var.dtypes or (BF16, BF16)
        kv_lens = _kv_lens(lay, ps)
        q_lens = torch.minimum(kv_lens, torch.full_like(kv_lens, 5))
        qo_indptr = torch.zeros(batch + 1, dtype=torch.int32, device=DEV)
        qo_indptr[1:] = torch.cumsum(q_lens, 0)
        k, v = lay["k"].to(kv_dtype), lay["v"].to(kv_dtype)
        if var.v_dim:
            v = v[..., : var.v_dim].contiguous()
        q = rnd(int(qo_indptr[-1]), 32, 128, seed=22, dtype=q_dtype)
        ctx = {"lay": lay, "q": q, "k": k, "v": v, "q_lens": q_lens, "kv_lens": kv_lens}
        ctx |= {"qo_indptr": qo_indptr, "kv_indptr": lay["indptr"]}
        wrapper = _prefill_wrapper(var.layout)
        kw = {"causal": True, "q_data_type": BF16, **_values(var.plan, ctx)}
        wrapper.plan(qo_indptr, lay["indptr"], lay["indices"], lay["last"], 32, 8, 128, ps, **kw)
        cache = _kv(var.layout, k, v, var.stacked)
        run_kw = {"return_lse": True, **_values(var.run, ctx)}
        return _results(wrapper.run(q, cache, *var.run_args, **run_kw))

    return call


def _prefill_cases() -> list[Case]:
    api = "flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper.run"
    out = []
    for ps, batch in ((1, 3), (64, 1), (64, 3)):
        name = f"gqa_paged_prefill_causal_h32_kv8_d128_ps{ps}"
        family = (
            "gqa_paged_prefill_causal_full_pages"
            if ps == 1
            else "gqa_paged_prefill_causal_batch_axis"
        )
        out.append(
            Case(
                api,
                f"{name} batch={batch}",
                _paged_prefill_call(Var("base", route=True), ps, batch),
                {name: solution(name, family)},
                variant="prefill:base",
            )
        )
    name = "gqa_paged_prefill_causal_h32_kv8_d128_ps64"
    variations = _prefill_common_variations(ragged=False)
    out += _wrapper_cases(api, name, variations, _paged_prefill_call, "prefill")
    return out


def _ragged_call(
    var: Var, heads: int = 32, kv_heads: int = 8, qk: int = 128, vo: int = 128
) -> Callable[[], tuple]:
    def call() -> tuple:
        import flashinfer

        q_dtype, kv_dtype = var.dtypes or (BF16, BF16)
        vo_dim = var.v_dim or vo
        kv_lens = torch.tensor([7, 30, 3], device=DEV, dtype=torch.int32)
        q_lens = torch.tensor([2, 30, 3], device=DEV, dtype=torch.int32)
        qo = torch.zeros(4, dtype=torch.int32, device=DEV)
        kvp = torch.zeros(4, dtype=torch.int32, device=DEV)
        qo[1:], kvp[1:] = torch.cumsum(q_lens, 0), torch.cumsum(kv_lens, 0)
        q = rnd(int(qo[-1]), heads, qk, seed=31, dtype=q_dtype)
        k = rnd(int(kvp[-1]), kv_heads, qk, seed=32).to(kv_dtype)
        v = rnd(int(kvp[-1]), kv_heads, vo_dim, seed=33).to(kv_dtype)
        if var.layout == "HND":
            k, v = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
        ctx = {"q": q, "k": k, "v": v, "q_lens": q_lens, "kv_lens": kv_lens}
        ctx |= {"qo_indptr": qo, "kv_indptr": kvp}
        ws = _workspace()
        wrapper = flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper(ws, var.layout)
        kw = {"head_dim_vo": vo, "causal": True, "q_data_type": BF16}
        kw |= _values(var.plan, ctx)
        wrapper.plan(qo, kvp, heads, kv_heads, qk, **kw)
        run_kw = {"return_lse": True, **_values(var.run, ctx)}
        return _results(wrapper.run(q, k, v, *var.run_args, **run_kw))

    return call


def _ragged_cases() -> list[Case]:
    api = "flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper.run"
    out = []
    mla = "mla_ragged_prefill_causal_h16_qk192_vo128"
    for causal in (True, False):
        var = Var("plan.causal", plan={"causal": causal}, route=causal)
        out += _wrapper_cases(
            api,
            mla,
            [var],
            lambda var: _ragged_call(var, 16, 16, 192, 128),
            "ragged-mla",
        )
    name = "gqa_ragged_prefill_causal_h32_kv8_d128"
    out.append(
        Case(
            api,
            f"{name} base",
            _ragged_call(Var("base", route=True)),
            {name: solution(name)},
            variant="ragged:base",
        )
    )
    out += _wrapper_cases(
        api, name, _prefill_common_variations(ragged=True), _ragged_call, "ragged"
    )
    return out


def _mla_call(var: Var, ps: int = 64, decode: bool = True) -> Callable[[], tuple]:
    def call() -> tuple:
        import flashinfer

        batch = 3
        q_dtype, kv_dtype = var.dtypes or (BF16, BF16)
        gen = torch.Generator().manual_seed(41)
        kv_lens = torch.randint(ps if ps > 1 else 1, 4 * ps + 2, (batch,), generator=gen)
        pages = (kv_lens + ps - 1) // ps
        kv_indptr = torch.zeros(batch + 1, dtype=torch.int32)
        kv_indptr[1:] = torch.cumsum(pages, 0)
        num_pages = int(kv_indptr[-1]) + 2
        kv_indices = torch.randperm(num_pages, generator=gen)[: int(kv_indptr[-1])].int()
        q_lens = (
            torch.full((batch,), var.q_rows or 1, dtype=torch.int64)
            if decode
            else torch.minimum(kv_lens, torch.full_like(kv_lens, 4))
        )
        qo = torch.zeros(batch + 1, dtype=torch.int32)
        qo[1:] = torch.cumsum(q_lens, 0)
        total_q = int(qo[-1])
        q_nope = rnd(total_q, 16, 512, seed=42, dtype=q_dtype)
        q_pe = rnd(total_q, 16, 64, seed=43, dtype=q_dtype)
        ckv = rnd(num_pages, ps, 512, seed=44).to(kv_dtype)
        kpe = rnd(num_pages, ps, 64, seed=45).to(kv_dtype)
        ctx = {"q_nope": q_nope, "q_pe": q_pe, "ckv": ckv, "kpe": kpe, "batch": batch}
        ctx |= {"qo": qo.to(DEV), "kv_indptr": kv_indptr.to(DEV), "kv_lens": kv_lens.int()}
        ctx |= {"kv_indices": kv_indices.to(DEV), "ps": ps}
        ws = _workspace()
        wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws)
        plan = {
            "qo_indptr": ctx["qo"],
            "kv_indptr": ctx["kv_indptr"],
            "kv_indices": ctx["kv_indices"],
            "kv_len_arr": kv_lens.int().to(DEV),
            "num_heads": 16,
            "head_dim_ckv": 512,
            "head_dim_kpe": 64,
            "page_size": ps,
            "causal": not decode,
            "sm_scale": 1 / math.sqrt(192),
            "q_data_type": BF16,
            "kv_data_type": BF16,
        }
        plan |= _values(var.plan, ctx)
        wrapper.plan(**plan)
        run = {"q_nope": q_nope, "q_pe": q_pe, "ckv_cache": ckv, "kpe_cache": kpe}
        run |= {"return_lse": True, **_values(var.run, ctx)}
        return _results(wrapper.run(*var.run_args, **{k: v for k, v in run.items()}))

    return call


def _mla_variations() -> list[Var]:
    V = Var
    f32 = lambda *shape: (lambda c: torch.ones(*shape, dtype=F32, device=DEV))  # noqa: E731
    return [
        V("out", run={"out": lambda c: torch.empty_like(c["q_nope"])}, route=True),
        V(
            "lse",
            run={"lse": lambda c: torch.empty(c["q_nope"].shape[:2], device=DEV)},
            route=True,
            also=("return_lse",),
        ),
        V("profiler_buffer", run={"profiler_buffer": lambda c: torch.zeros(1024, device=DEV)}),
        V("kv_len", run={"kv_len": lambda c: c["kv_lens"].to(DEV)}),
        V("page_table", run={"page_table": lambda c: c["kv_indices"][None, :]}),
        V("return_lse_base_on_e", run={"return_lse_base_on_e": True}),
        V("o_scale", run={"o_scale": 2.0}),
        # The preferred structural form: q_nope and ckv_cache are then None, so the call's
        # definition cannot be read from them (its key).
        V(
            "query",
            run={"q_nope": None, "q_pe": None, "query": lambda c: (c["q_nope"], c["q_pe"])},
            expect="key",
        ),
        V(
            "kv_cache",
            run={"ckv_cache": None, "kpe_cache": None, "kv_cache": lambda c: (c["ckv"], c["kpe"])},
            expect="key",
        ),
        V("ckv_scale", run={"ckv_scale": 0.5}),
        V("ckv_scale_arr", run={"ckv_scale_arr": f32(1)}),
        V("kpe_scale", run={"kpe_scale": 0.5}),
        V("sinks", run={"sinks": f32(16)}),
        V("skip_softmax_threshold_scale_factor", run={"skip_softmax_threshold_scale_factor": 1.0}),
        V("bmm1_scale", run={"bmm1_scale": 1.0, "bmm2_scale": 1.0}),
        V("bmm2_scale", run={"bmm2_scale": 1.0}),
        V(
            "q_nope",
            run={
                "q_nope": lambda c: torch.cat([c["q_nope"], c["q_nope"]]),
                "q_pe": lambda c: torch.cat([c["q_pe"], c["q_pe"]]),
            },
            expect="tensor:kv_last_page_len",  # the first check it fails, as for decode
            also=("plan.kv_indptr",),
        ),
        V("plan.qo_indptr", q_rows=2),  # two query tokens per sequence: not a decode
        V("plan.num_heads", plan={"num_heads": 8}),
        V("plan.causal", plan={"causal": True}, route=True),
        V("plan.sm_scale", plan={"sm_scale": None}),
        V("plan.q_data_type", plan={"q_data_type": F16}, dtypes=(F16, F16), jit="fp16"),
        V("plan.kv_data_type", plan={"kv_data_type": FP8}, dtypes=(BF16, FP8), jit="fp8"),
        V("plan.use_profiler", plan={"use_profiler": True}, route=True),
        V(
            "plan.metadata",
            plan={
                "metadata": lambda c: __import__("flashinfer").mla.MLAPlanMetadata.csr(
                    c["qo"], c["kv_indptr"], c["kv_indices"], c["kv_lens"].to(DEV)
                )
            },
        ),
        V("plan.cum_seq_lens_q", plan={"cum_seq_lens_q": lambda c: c["qo"]}),
        V("plan.block_tables", plan={"block_tables": lambda c: c["kv_indices"][None, :]}),
        V("plan.seq_lens", plan={"seq_lens": lambda c: c["kv_lens"].to(DEV)}),
        V("plan.max_q_len", plan={"max_q_len": 1}),
        V("plan.query_layout", plan={"query_layout": "packed"}),
        V("plan.kv_cache_layout", plan={"kv_cache_layout": "packed"}),
        V("plan.lse_mode", plan={"lse_mode": "base2"}, route=True),
        V("plan.lse_mode", plan={"lse_mode": "basee"}),
        V("plan.output_dtype", plan={"output_dtype": BF16}, route=True),
        V("plan.output_scale", plan={"output_scale": "per-tensor"}),
        V("plan.scale_mode", plan={"scale_mode": "kv-per-tensor"}),
        V("plan.skip_softmax", plan={"skip_softmax": True}),
        V("plan.enable_pdl", plan={"enable_pdl": True}, route=True),
        V("plan.use_sinks", plan={"use_sinks": True}),
    ]


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
        out.append(
            Case(
                api,
                f"{name} {label}",
                _mla_call(Var("base", route=True), ps, decode),
                {name: solution(name, family)},
                variant="mla:base",
            )
        )
    name = "mla_paged_prefill_causal_h16_ckv512_kpe64_ps64"
    causal = Var("plan.causal", plan={"causal": False})
    out += _wrapper_cases(api, name, [causal], lambda v: _mla_call(v, 64, False), "mla")
    name = "mla_paged_decode_h16_ckv512_kpe64_ps64"
    out += _wrapper_cases(api, name, _mla_variations(), _mla_call, "mla")
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


# ---------------------------------------------------------------------------------------
# GDN and MoE: inputs from the definitions' own generators
# ---------------------------------------------------------------------------------------


def _inputs(name: str, seed: int, **axes: int) -> dict:
    from fibgen.runtime.inputs.make import InputSpec, generate_inputs

    d, fam = CATALOGUE[name]
    return generate_inputs(InputSpec.from_ir(d, fam), axes, device=DEV, seed=seed)


def _pair(result: Any, fn: str) -> tuple:
    """FlashInfer's GDN functions return (output, state); a call must return the same."""
    if not (isinstance(result, tuple) and len(result) == 2):
        got = type(result).__name__ if not isinstance(result, torch.Tensor) else "one tensor"
        raise TypeError(f"{fn} returned {got}, where FlashInfer returns (output, state)")
    return result


def _gdn_cases() -> list[Case]:
    out = []
    name = "gdn_decode_qk4_v8_d128_k_last"
    for batch in (1, 4):

        def decode(batch=batch, name=name):
            import flashinfer.gdn_decode  # not imported by `import flashinfer`

            x = _inputs(name, 61, batch_size=batch)
            args = [x[k] for k in ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b")]
            if x["state"] is None:
                b, hv = x["v"].shape[0], x["v"].shape[2]
                x["state"] = torch.zeros(b, hv, 128, 128, device=DEV)
                args[3] = x["state"]
            result = flashinfer.gdn_decode.gated_delta_rule_decode(*args, scale=float(x["scale"]))
            return _pair(result, "gated_delta_rule_decode")

        out.append(
            Case(
                "flashinfer.gdn_decode.gated_delta_rule_decode",
                f"{name} batch={batch}",
                decode,
                {name: solution(name)},
                variant="gdn:decode",
            )
        )
    name = "gdn_mtp_qk4_v8_d128_k_last"
    # (batch, seq_len, disable_state_update, with the intermediate buffer, the rule). A call
    # with the buffer goes to FlashInfer (the family's rule: it writes the buffer by batch row).
    grid = (
        (1, 2, True, False, None),
        (4, 3, None, False, None),
        (2, 2, False, False, "disable_state_update"),
        (3, 2, True, True, "intermediate_states_buffer"),
    )
    for batch, seq_len, disable, buffered, rule in grid:

        def mtp(batch=batch, seq_len=seq_len, disable=disable, buffered=buffered, name=name):
            import flashinfer.gdn_decode

            x = _inputs(name, 71, batch_size=batch, seq_len=seq_len, pool_size=2 * batch + 1)
            names = ("q", "k", "v", "initial_state", "initial_state_indices", "A_log", "a")
            args = [x[k] for k in names] + [x["dt_bias"], x["b"]]
            buffer = x["intermediate_states_buffer"] if buffered else None
            result = flashinfer.gdn_decode.gated_delta_rule_mtp(
                *args,
                scale=float(x["scale"]),
                intermediate_states_buffer=buffer,
                disable_state_update=disable,
            )
            return (*_pair(result, "gated_delta_rule_mtp"), *([buffer] if buffered else []))

        label = f"{name} batch={batch} seq_len={seq_len} disable_state_update={disable}"
        out.append(
            Case(
                "flashinfer.gdn_decode.gated_delta_rule_mtp",
                label + (" intermediate_states_buffer" if buffered else ""),
                mtp,
                {name: solution(name)},
                expect=rule,
                variant="gdn:mtp",
            )
        )
    name = "gdn_decode_pool_qk4_v8_d128"
    for batch, pool_size in ((1, 3), (5, 9)):

        def pool(batch=batch, pool_size=pool_size, name=name):
            import flashinfer.gdn_decode

            x = _inputs(name, 81, batch_size=batch, pool_size=pool_size)
            result = flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose(
                x["q"],
                x["k"],
                x["v"],
                None,
                x["A_log"],
                x["a"],
                x["dt_bias"],
                x["b"],
                scale=float(x["scale"]),
                initial_state=x["pool"],
                initial_state_indices=x["slots"],
            )
            return _pair(result, "gated_delta_rule_decode_pretranspose")

        out.append(
            Case(
                "flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose",
                f"{name} batch={batch} pool_size={pool_size}",
                pool,
                {name: solution(name)},
                variant="gdn:pool",
            )
        )
    return out


def _mhc_cases() -> list[Case]:
    """mHC's plain CUDA kernels (csrc/mhc), which run on any GPU FlashInfer supports."""
    import flashinfer.mhc

    out = []
    for name, tokens in (("mhc_post_hc4_h4096", 7), ("mhc_post_hc4_h7168", 64)):

        def post(name=name, tokens=tokens):
            x = _inputs(name, 81, num_tokens=tokens)
            args = (x["x"], x["residual"], x["post_layer_mix"], x["comb_res_mix"])
            return (flashinfer.mhc.mhc_post(*args),)

        out.append(
            Case("flashinfer.mhc.mhc_post", f"{name} tokens={tokens}", post, {name: solution(name)})
        )
    scalars = ("rms_eps", "mhc_pre_eps", "mhc_sinkhorn_eps", "mhc_post_mult_value")
    name = "mhc_pre_big_fuse_hc4_h7168_mix24"
    for tokens, splits in ((5, 1), (64, 4)):

        def pre(tokens=tokens, splits=splits, name=name):
            x = _inputs(name, 82, num_tokens=tokens)
            dot_mix, sqrsum = x["dot_mix"], x["sqrsum"]
            if splits > 1:  # partials that the kernel sums
                dot_mix = torch.stack([dot_mix / splits] * splits)
                sqrsum = torch.stack([sqrsum / splits] * splits)
            kwargs = {k: float(x[k]) for k in scalars}
            return flashinfer.mhc.mhc_pre_big_fuse(
                dot_mix, sqrsum, x["residual"], x["mhc_scale"], x["mhc_base"], int(x["k"]),
                sinkhorn_repeat=int(x["sinkhorn_repeat"]), num_splits=splits, **kwargs,
            )  # fmt: skip

        out.append(
            Case(
                "flashinfer.mhc.mhc_pre_big_fuse",
                f"{name} tokens={tokens} num_splits={splits}",
                pre,
                {name: solution(name)},
            )
        )
    name = "mhc_pre_big_fuse_with_prenorm_hc4_h4096_mix24"
    for tokens in (3, 128):

        def prenorm(tokens=tokens, name=name):
            x = _inputs(name, 83, num_tokens=tokens)
            kwargs = {k: float(x[k]) for k in scalars}
            return flashinfer.mhc.mhc_pre_big_fuse_with_prenorm(
                x["dot_mix"], x["residual"], x["mhc_scale"], x["mhc_base"],
                sinkhorn_repeat=int(x["sinkhorn_repeat"]), **kwargs,
            )  # fmt: skip

        out.append(
            Case(
                "flashinfer.mhc.mhc_pre_big_fuse_with_prenorm",
                f"{name} tokens={tokens}",
                prenorm,
                {name: solution(name)},
            )
        )
    return out


def _needs_sm100() -> str | None:
    major, minor = torch.cuda.get_device_capability()
    if major >= 10:
        return None
    return (
        "FlashInfer's trtllm-gen MoE kernels need SM100 or newer; this GPU is "
        f"SM{major}{minor} (apply on is still checked: the call must be routed)"
    )


def _moe_cases() -> list[Case]:
    from flashinfer.tllm_enums import ActivationType

    out = []
    name = "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048"
    consts = dict(CATALOGUE[name][0].consts)
    for seq_len, shuffled in ((1, False), (16, False), (4, True)):

        def block_scale(seq_len=seq_len, shuffled=shuffled, name=name, consts=consts):
            import flashinfer.fused_moe

            x = _inputs(name, 81, seq_len=seq_len)
            names = ("routing_logits", "routing_bias", "hidden_states", "hidden_states_scale")
            names += ("gemm1_weights", "gemm1_weights_scale", "gemm2_weights")
            args = [x[k] for k in names] + [x["gemm2_weights_scale"]]
            args += [consts["num_experts"], 8, 8, 4, consts["intermediate_size"]]
            args += [int(x["local_expert_offset"]), consts["num_local_experts"]]
            args += [float(x["routed_scaling_factor"])]
            return _results(
                flashinfer.fused_moe.trtllm_fp8_block_scale_moe(
                    *args, routing_method_type=2, use_shuffled_weight=shuffled
                )
            )

        out.append(
            Case(
                "flashinfer.fused_moe.trtllm_fp8_block_scale_moe",
                f"{name} seq_len={seq_len} use_shuffled_weight={shuffled}",
                block_scale,
                {name: solution(name)},
                expect="use_shuffled_weight" if shuffled else None,
                needs=_needs_sm100,
                variant=f"moe:block:{seq_len}",
            )
        )
    name = "trtllm_fp8_per_tensor_scale_moe_topk8_e128_h2048_i768"
    consts = dict(CATALOGUE[name][0].consts)
    for seq_len, cap in ((1, None), (16, None), (4, 7.0)):

        def per_tensor(seq_len=seq_len, cap=cap, name=name, consts=consts):
            import flashinfer.fused_moe

            x = _inputs(name, 91, seq_len=seq_len)
            e = consts["num_experts"]
            names = ("hidden_states", "gemm1_weights", "output1_scales_scalar")
            names += ("output1_scales_gate_scalar", "gemm2_weights", "output2_scales_scalar")
            args = [x["routing_logits"], None] + [x[k] for k in names]
            args += [e, 8, None, None, consts["intermediate_size"], 0, e, None, False]
            return _results(
                flashinfer.fused_moe.trtllm_fp8_per_tensor_scale_moe(
                    *args,
                    routing_method_type=1,
                    activation_type=ActivationType.Swiglu.value,
                    gemm1_clamp_limit=cap,
                )
            )

        out.append(
            Case(
                "flashinfer.fused_moe.trtllm_fp8_per_tensor_scale_moe",
                f"{name} seq_len={seq_len} gemm1_clamp_limit={cap}",
                per_tensor,
                {name: solution(name)},
                expect="gemm1_clamp_limit" if cap else None,
                needs=_needs_sm100,
                variant=f"moe:per-tensor:{seq_len}",
            )
        )
    return out


# ---------------------------------------------------------------------------------------
# MoE routing (moe_routing.fidef) and the SM90 mixed-input weight preparation
# (moe_sm90_mixed_prepare.fidef): kernels that run on an H100
# ---------------------------------------------------------------------------------------


# FlashInfer runs the SM90 mixed-GEMM weight interleave from its whole CUTLASS fused-MoE
# module (``get_cutlass_fused_moe_module("90")``), whose build outlasts one call of the lent
# GPU and whose sources the packed FlashInfer leaves out. With --interleave-alone, the
# interleave kernels are built from FlashInfer's own source file, unchanged, into a module of
# their own (binding: benchmarks/sm90_interleave.cu), and FlashInfer's Python functions call
# that module in place of the whole one: its checks, its layout, its kernels.
# Read from the environment too, so that --prebuild's processes make the same cases.
INTERLEAVE_ALONE = os.environ.get("FIBGEN_INTERLEAVE_ALONE") == "1"
_INTERLEAVE_SOURCE = (
    "nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_mixed_utils.cu"
)
_interleave_module: list[Any] = []


def _interleave_spec() -> Any:
    """FlashInfer's JIT spec of the interleave kernels alone, with its SM90 flags."""
    from flashinfer.jit import env as jit_env
    from flashinfer.jit.core import gen_jit_spec, sm90a_nvcc_flags

    source = jit_env.FLASHINFER_CSRC_DIR / _INTERLEAVE_SOURCE
    if not source.is_file():
        raise FileNotFoundError(f"FlashInfer's {source} is not installed")
    return gen_jit_spec(
        "fibgen_sm90_mixed_gemm_interleave",
        [source, ROOT / "benchmarks" / "sm90_interleave.cu"],
        extra_cuda_cflags=sm90a_nvcc_flags,
        extra_include_paths=[jit_env.FLASHINFER_CSRC_DIR / "nv_internal"],
    )


def _interleave_alone_module() -> Any:
    if not _interleave_module:
        _interleave_module.append(_interleave_spec().build_and_load())
    return _interleave_module[0]


@contextlib.contextmanager
def _interleave_kernels():
    """FlashInfer's interleave functions call the module built alone (--interleave-alone)."""
    if not INTERLEAVE_ALONE:
        yield
        return
    import flashinfer.fused_moe.core as core

    module = _interleave_alone_module()
    whole = core.get_cutlass_fused_moe_module
    core.get_cutlass_fused_moe_module = lambda *args, **kwargs: module
    try:
        yield
    finally:
        core.get_cutlass_fused_moe_module = whole


def _alone(label: str) -> str:
    return label + (" (interleave kernels built alone)" if INTERLEAVE_ALONE else "")


def _moe_routing_cases() -> list[Case]:
    out = []
    for name, tokens in (
        ("fused_topk_deepseek_e256_k8_ng8_kg4_bf16", 1),
        ("fused_topk_deepseek_e256_k8_ng8_kg4_fp32", 33),
        ("fused_topk_deepseek_e256_k8_ng8_kg4_bf16", 17),
    ):
        d = CATALOGUE[name][0]
        params = dict(d.param_values)

        def topk(name=name, tokens=tokens, params=params, dtype=d.inputs[0].dtype):
            import flashinfer.fused_moe

            x = _inputs(name, 101, num_tokens=tokens)
            k = params["top_k"]
            values = torch.zeros(tokens, k, dtype=x["scores"].dtype, device=DEV)
            indices = torch.zeros(tokens, k, dtype=torch.int32, device=DEV)
            result = flashinfer.fused_moe.fused_topk_deepseek(
                x["scores"],
                x["bias"],
                params["n_group"],
                params["topk_group"],
                k,
                float(x["routed_scaling_factor"]),
                values,
                indices,
            )
            return (result, values, indices)

        out.append(
            Case(
                "flashinfer.fused_moe.fused_topk_deepseek",
                f"{name} num_tokens={tokens}",
                topk,
                {name: solution(name)},
                variant="moe_routing:dsv3",
            )
        )
    for name, tokens, shared in (
        ("hash_topk_e256_k8_sh0", 1, 0),
        ("hash_topk_e256_k8_sh1", 40, 1),
    ):

        def hashed(name=name, tokens=tokens, shared=shared):
            import flashinfer.fused_moe

            x = _inputs(name, 111, num_tokens=tokens, vocab=1000)
            return _results(
                flashinfer.fused_moe.hash_topk(
                    x["router_logits"],
                    x["input_ids"],
                    x["tid2eid"],
                    num_fused_shared_experts=shared,
                    routed_scaling_factor=float(x["routed_scaling_factor"]),
                )
            )

        out.append(
            Case(
                "flashinfer.fused_moe.hash_topk.hash_topk",
                f"{name} num_tokens={tokens}",
                hashed,
                {name: solution(name)},
                variant="moe_routing:hash",
            )
        )
    for quant_type in ("fp4", "fp4_fp8", "int4"):
        name = f"sm90_mixed_gemm_weight_interleave_{quant_type}"

        def weights(name=name, quant_type=quant_type):
            import flashinfer.fused_moe

            w = torch.randint(
                0, 256, (3, 256, 512), dtype=torch.uint8, device=DEV, generator=g(121)
            )
            with _interleave_kernels():
                return _results(
                    flashinfer.fused_moe.interleave_moe_weights_for_sm90_mixed_gemm(w, quant_type)
                )

        out.append(
            Case(
                "flashinfer.fused_moe.interleave_moe_weights_for_sm90_mixed_gemm",
                _alone(f"{name} experts=3 n=256 k=1024"),
                weights,
                {name: solution(name)},
                variant="moe_prepare:sm90_weights",
            )
        )
    for name, dtype, group_size in (
        ("sm90_mixed_gemm_scale_interleave_g32_i8", torch.uint8, 32),
        ("sm90_mixed_gemm_scale_interleave_g128_bf16", torch.bfloat16, 128),
    ):

        def scales(name=name, dtype=dtype, group_size=group_size):
            import flashinfer.fused_moe

            groups = 1024 // group_size
            if dtype == torch.uint8:
                raw = torch.randint(
                    110, 135, (3, 256, groups), dtype=dtype, device=DEV, generator=g(131)
                )
            else:
                raw = torch.rand(3, 256, groups, device=DEV, generator=g(131)).to(dtype)
            return _results(
                flashinfer.fused_moe.interleave_moe_scales_for_sm90_mixed_gemm(raw, group_size)
            )

        out.append(
            Case(
                "flashinfer.fused_moe.interleave_moe_scales_for_sm90_mixed_gemm",
                f"{name} experts=3 rows=256 k=1024",
                scales,
                {name: solution(name)},
            )
        )
    # Humming's MXFP4 preparation for FP8 activations: the logical rewrite, and the same
    # interleaved for the SM90 GEMM (its weight interleave runs a CUDA kernel).
    for interleave, max_range in ((False, 11), (True, 11)):
        name = "sm90_mixed_gemm_humming_preprocess_" + ("r11" if interleave else "logical_r11")

        def humming(interleave=interleave, max_range=max_range):
            import flashinfer.fused_moe

            w = torch.randint(
                0, 256, (3, 256, 512), dtype=torch.uint8, device=DEV, generator=g(161)
            )
            raw = torch.randint(
                108, 136, (3, 256, 32), dtype=torch.uint8, device=DEV, generator=g(162)
            )
            with _interleave_kernels():
                return _results(
                    flashinfer.fused_moe.preprocess_moe_weights_for_sm90_mixed_gemm_humming(
                        w, raw, max_range, interleave=interleave
                    )
                )

        out.append(
            Case(
                "flashinfer.fused_moe.preprocess_moe_weights_for_sm90_mixed_gemm_humming",
                (_alone if interleave else str)(
                    f"{name} experts=3 rows=256 k=1024 max_range={max_range}"
                ),
                humming,
                {name: solution(name)},
                variant="moe_prepare:sm90_weights",
            )
        )
    return out


# ---------------------------------------------------------------------------------------
# CuTe-DSL MoE (moe_cute_dsl.fidef): the SM90 bfloat16 kernel runs on an H100
# ---------------------------------------------------------------------------------------


def _needs_sm90() -> str | None:
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) == (9, 0):
        return None
    return (
        "FlashInfer's cute_dsl_fused_moe_bf16 runs only on SM90; this GPU is "
        f"SM{major}{minor} (apply on is still checked: the call must be routed)"
    )


def _moe_cute_dsl_cases() -> list[Case]:
    out = []
    # (definition, seq_len, gpt-oss's SwiGLU, expert-parallel rank, a keyword, the rule)
    grid = (
        ("cute_dsl_fused_moe_bf16_e128_h2048_i768_topk8", 1, False, False, {}, None),
        ("cute_dsl_fused_moe_bf16_e128_h2048_i768_topk8", 37, False, True, {}, None),
        ("cute_dsl_fused_moe_bf16_e32_h2880_i2880_topk4", 16, True, False, {}, None),
        (
            "cute_dsl_fused_moe_bf16_e32_h2880_i2880_topk4",
            5,
            True,
            False,
            {"use_fused_finalize": False},
            None,
        ),
        (
            "cute_dsl_fused_moe_bf16_e32_h2880_i2880_topk4",
            4,
            False,
            False,
            {"situ_beta": 4.0},
            "situ_beta",
        ),
        (
            "cute_dsl_fused_moe_bf16_e128_h2048_i768_topk8",
            4,
            False,
            False,
            {"activation_type": 8},
            "activation_type",
        ),
    )
    for name, seq_len, oai, ep, extra, rule in grid:
        consts = dict(CATALOGUE[name][0].consts)

        def fused(name=name, seq_len=seq_len, oai=oai, ep=ep, extra=extra, consts=consts):
            import flashinfer.fused_moe

            x = _inputs(name, 141, seq_len=seq_len)
            e, k = consts["num_local_experts"], consts["top_k"]
            ids, kwargs = x["token_selected_experts"], dict(extra)
            if ep:
                # Rank 1 of 2: global experts e..2e-1; ids of rank 0's experts add nothing.
                ids = torch.where(ids % 3 == 0, ids, ids + e).to(torch.int32)
                kwargs |= {"num_local_experts": e, "local_expert_offset": e}
            if oai:
                kwargs |= {
                    k_: float(x[k_]) for k_ in ("swiglu_alpha", "swiglu_beta", "swiglu_limit")
                }
            return _results(
                flashinfer.fused_moe.cute_dsl_fused_moe_bf16(
                    x["x"],
                    ids,
                    x["token_final_scales"],
                    x["w1_weight"],
                    x["w2_weight"],
                    2 * e if ep else e,
                    k,
                    **kwargs,
                )
            )

        label = f"{name} seq_len={seq_len}" + (" oai" if oai else "") + (" ep" if ep else "")
        label += "".join(f" {k_}={v}" for k_, v in extra.items())
        out.append(
            Case(
                "flashinfer.fused_moe.cute_dsl_fused_moe_bf16",
                label,
                fused,
                {name: solution(name)},
                expect=rule,
                needs=_needs_sm90,
                variant=f"moe_cute_dsl:{name}:{int(oai)}",
            )
        )
    return out


# ---------------------------------------------------------------------------------------
# Single-kernel block-FP8 MoE (moe_monomoe.fidef): SM90a, the Qwen3.5-35B-A3B shape only
# ---------------------------------------------------------------------------------------


def _needs_sm90a() -> str | None:
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) == (9, 0):
        return None
    return (
        "FlashInfer's mono_moe runs only on SM90a; this GPU is "
        f"SM{major}{minor} (apply on is still checked: the call must be routed)"
    )


def _monomoe_cases() -> list[Case]:
    out = []
    name = "mono_moe_e256_h2048_i512_topk8"
    # (seq_len, scoring_func, renormalize, pre-interleaved weights, top_k, the rule)
    grid = (
        (1, "softmax", True, False, 8, None),
        (8, "softmax", True, False, 8, None),
        (5, "softmax", False, False, 8, None),
        (3, "sigmoid", True, False, 8, None),
        (4, "sigmoid", False, True, 8, None),
        (2, "softmax", True, False, 4, "top_k"),
    )
    for seq_len, scoring, renormalize, packed, top_k, rule in grid:

        def mono(
            seq_len=seq_len, scoring=scoring, renormalize=renormalize, packed=packed, top_k=top_k
        ):
            import flashinfer.fused_moe
            from flashinfer.fused_moe.monomoe import interleave_for_tma_wgmma_up

            x = _inputs(name, 151, seq_len=seq_len)
            up = x["expert_weights_up"]
            if packed:
                up = interleave_for_tma_wgmma_up(up.clone())
            return _results(
                flashinfer.fused_moe.mono_moe(
                    x["activations_in"],
                    x["router_logits"],
                    up,
                    x["expert_scales_up"],
                    x["expert_weights_down"],
                    x["expert_scales_down"],
                    top_k,
                    scoring_func=scoring,
                    renormalize=renormalize,
                    interleave_up=not packed,
                )
            )

        label = f"{name} seq_len={seq_len} {scoring} renormalize={renormalize}"
        label += " interleave_up=False" if packed else ""
        label += f" top_k={top_k}" if top_k != 8 else ""
        out.append(
            Case(
                "flashinfer.fused_moe.mono_moe",
                label,
                mono,
                {name: solution(name)},
                expect=rule,
                needs=_needs_sm90a,
                variant="monomoe",
            )
        )
    return out


# ---------------------------------------------------------------------------------------
# Block-sparse, cascade, BatchAttention and POD wrappers
# ---------------------------------------------------------------------------------------


def _indptr(lens: list[int]) -> torch.Tensor:
    out = torch.zeros(len(lens) + 1, dtype=torch.int32)
    out[1:] = torch.cumsum(torch.tensor(lens), 0)
    return out.to(DEV)


def _block_sparse_call(var: Var, R: int = 16, C: int = 16) -> Callable[[], tuple]:
    def call() -> tuple:
        import flashinfer

        q_dtype, kv_dtype = var.dtypes or (BF16, BF16)
        # Four block rows over three column blocks; every row sees at least one block.
        indptr = _indptr([1, 2, 2, 3])
        indices = torch.tensor([0, 0, 2, 1, 2, 0, 1, 2], dtype=torch.int32, device=DEV)
        M, N = 4 * R, 3 * C
        q = rnd(M, 32, 128, seed=41, dtype=q_dtype)
        k, v = rnd(N, 8, 128, seed=42).to(kv_dtype), rnd(N, 8, 128, seed=43).to(kv_dtype)
        ctx = {"q": q}
        wrapper = flashinfer.sparse.BlockSparseAttentionWrapper(_workspace())
        kw = {"q_data_type": q_dtype, "kv_data_type": kv_dtype, "o_data_type": q_dtype}
        wrapper.plan(indptr, indices, M, N, R, C, 32, 8, 128, **kw | _values(var.plan, ctx))
        run_kw = {"return_lse": True, **_values(var.run, ctx)}
        return _results(wrapper.run(q, k, v, **run_kw))

    return call


def _var_block_sparse_call(var: Var) -> Callable[[], tuple]:
    def call() -> tuple:
        import flashinfer

        q_dtype, kv_dtype = var.dtypes or (BF16, BF16)
        rows = torch.tensor([16, 32, 16], dtype=torch.int32).expand(8, 3).contiguous()
        cols = torch.tensor([24, 8, 16], dtype=torch.int32).expand(8, 3).contiguous()
        if var.param == "plan.block_row_sz":  # another cut of the rows for one KV head
            rows[1] = torch.tensor([32, 16, 16], dtype=torch.int32)
        # A mask per KV head; every row block sees its diagonal block.
        mask = torch.rand(8, 3, 3, generator=torch.Generator().manual_seed(44)) < 0.5
        mask |= torch.eye(3, dtype=torch.bool)
        q = rnd(32, 64, 128, seed=45, dtype=q_dtype)
        k, v = rnd(8, 48, 128, seed=46).to(kv_dtype), rnd(8, 48, 128, seed=47).to(kv_dtype)
        wrapper = flashinfer.sparse.VariableBlockSparseAttentionWrapper(_workspace())
        kw = {"q_data_type": q_dtype, "kv_data_type": kv_dtype, **_values(var.plan, {"q": q})}
        wrapper.plan(mask.to(DEV), rows.to(DEV), cols.to(DEV), 32, 8, 128, **kw)
        return _results(wrapper.run(q, k, v, **_values(var.run, {"q": q})))

    return call


def _cascade_call(var: Var) -> Callable[[], tuple]:
    def call() -> tuple:
        import flashinfer

        # One group of three requests: a shared prefix of 4 full pages (level 0), then each
        # request's own pages (level 1), all in one paged cache of 16-token pages.
        order = torch.randperm(16, generator=torch.Generator().manual_seed(48)).to(torch.int32)
        q_lens = [2, 3, 1]
        qo = [_indptr([sum(q_lens)]), _indptr(q_lens)]
        kv_indptr = [_indptr([4]), _indptr([2, 1, 3])]
        kv_indices = [order[:4].to(DEV), order[4:10].to(DEV)]
        last = [torch.tensor([16], dtype=torch.int32, device=DEV)]
        last.append(torch.tensor([5, 16, 9], dtype=torch.int32, device=DEV))
        q_dtype, kv_dtype = var.dtypes or (BF16, BF16)
        k = rnd(16, 16, 8, 128, seed=49).to(kv_dtype)
        v = rnd(16, 16, 8, 128, seed=50).to(kv_dtype)
        q = rnd(sum(q_lens), 32, 128, seed=51, dtype=q_dtype)
        wrapper = flashinfer.cascade.MultiLevelCascadeAttentionWrapper(2, _workspace(), "NHD")
        kw = {"causal": True, "q_data_type": q_dtype, "kv_data_type": kv_dtype}
        wrapper.plan(qo, kv_indptr, kv_indices, last, 32, 8, 128, 16, **kw | var.plan)
        return _results(wrapper.run(q, (k, v)))

    return call


def _batch_attention_call(var: Var, ps: int = 64, batch: int = 3) -> Callable[[], tuple]:
    def call() -> tuple:
        import flashinfer

        lay = _paged_layout(52, batch, ps)
        kv_lens = _kv_lens(lay, ps)
        q_lens = torch.minimum(kv_lens, torch.tensor([1, 5, 2], device=kv_lens.device))
        qo = _indptr(q_lens.tolist())
        q = rnd(int(qo[-1]), 32, 128, seed=53)
        ctx = {"q": q}
        wrapper = flashinfer.attention.BatchAttention(kv_layout="NHD")
        kw = {"causal": True, "q_data_type": BF16, "kv_data_type": BF16}
        plan = (qo, lay["indptr"], lay["indices"], kv_lens, 32, 8, 128, 128, ps)
        wrapper.plan(*plan, **kw | _values(var.plan, ctx))
        return _results(wrapper.run(q, (lay["k"], lay["v"]), **_values(var.run, ctx)))

    return call


def _pod_call(var: Var, ps: int = 16) -> Callable[[], tuple]:
    def call() -> tuple:
        import flashinfer

        dt = (var.dtypes or (BF16, BF16))[0]  # one dtype for every tensor
        lay = _paged_layout(54, 4, ps)  # the decode batch: one query per request
        q_d = rnd(4, 32, 128, seed=55, dtype=dt)
        q_p = rnd(7, 32, 128, seed=56, dtype=dt)  # the prefill request's last 7 of 40 tokens
        k_p, v_p = rnd(40, 8, 128, seed=57, dtype=dt), rnd(40, 8, 128, seed=58, dtype=dt)
        if var.param == "kv_layout_p":
            k_p, v_p = k_p.transpose(0, 1).contiguous(), v_p.transpose(0, 1).contiguous()
        ctx = {"q_p": q_p}
        wrapper = flashinfer.pod.PODWithPagedKVCacheWrapper(_workspace(), "NHD")
        kw = {"q_data_type": dt, "kv_data_type": dt, **_values(var.plan, ctx)}
        wrapper.plan(lay["indptr"], lay["indices"], lay["last"], 32, 8, 128, ps, **kw)
        run_kw = {"causal_p": True, **_values(var.run, ctx)}
        cache = (lay["k"].to(dt), lay["v"].to(dt))
        return _results(wrapper.run(q_p, k_p, v_p, q_d, cache, **run_kw))

    return call


def _batch_pod_call(var: Var, ps: int = 16) -> Callable[[], tuple]:
    def call() -> tuple:
        import flashinfer

        pre, dec = _paged_layout(59, 2, ps), _paged_layout(60, 4, ps)
        q_lens = torch.minimum(_kv_lens(pre, ps), torch.tensor([6, 3], device=DEV))
        qo_p, qo_d = _indptr(q_lens.tolist()), _indptr([1, 1, 1, 1])
        q_p, q_d = rnd(int(qo_p[-1]), 32, 128, seed=61), rnd(4, 32, 128, seed=62)
        wrapper = flashinfer.pod.BatchPODWithPagedKVCacheWrapper(_workspace(), "NHD")
        plan = (qo_p, pre["indptr"], pre["indices"], pre["last"])
        plan += (qo_d, dec["indptr"], dec["indices"], dec["last"], 32, 8, 128, ps)
        kw = {"q_data_type": BF16, "kv_data_type": BF16, **_values(var.plan, {})}
        wrapper.plan(*plan, **kw)
        run_kw = {"causal_p": True, **_values(var.run, {})}
        caches = (pre["k"], pre["v"]), (dec["k"], dec["v"])
        return _results(wrapper.run(q_p, caches[0], q_d, caches[1], **run_kw))

    return call


def _attention_more_cases() -> list[Case]:
    V = Var
    out: list[Case] = []
    sparse = "flashinfer.sparse.BlockSparseAttentionWrapper.run"
    name = "block_sparse_run_h32_kv8_d128"
    for R, C in ((16, 16), (1, 1)):
        out += _wrapper_cases(
            sparse,
            name,
            [V(f"R={R} C={C}", route=True)],
            lambda var, R=R, C=C: _block_sparse_call(var, R, C),
            "block_sparse",
        )
    out += _wrapper_cases(
        sparse,
        name,
        [
            V("plan.sm_scale", plan={"sm_scale": 0.05}, route=True),
            V("plan.logits_soft_cap", plan={"logits_soft_cap": 30.0}, route=True, jit="cap"),
            V("out", run={"out": lambda c: torch.empty_like(c["q"])}, route=True),
            V("lse", run={"lse": lambda c: torch.empty(c["q"].shape[:2], device=DEV)}, route=True),
            V("plan.causal", plan={"causal": True}, jit="causal"),
            V("plan.q_data_type", plan={"q_data_type": F16}, dtypes=(F16, F16), jit="fp16"),
        ],  # fmt: skip
        _block_sparse_call,
        "block_sparse",
    )
    out += _wrapper_cases(
        "flashinfer.sparse.VariableBlockSparseAttentionWrapper.run",
        "var_block_sparse_run_h32_kv8_d128",
        [
            V("base", route=True),
            V("plan.sm_scale", plan={"sm_scale": 0.05}, route=True),
            V("plan.logits_soft_cap", plan={"logits_soft_cap": 30.0}, route=True, jit="cap"),
            V("return_lse", run={"return_lse": True}),
            V("plan.causal", plan={"causal": True}, jit="causal"),
            V("plan.block_row_sz"),
        ],
        _var_block_sparse_call,
        "var_block_sparse",
    )
    out += _wrapper_cases(
        "flashinfer.cascade.MultiLevelCascadeAttentionWrapper.run",
        "multi_level_cascade_run_h32_kv8_d128_ps16",
        [
            V("base", route=True),
            V("plan.causal", plan={"causal": False}, route=True),
            V("plan.sm_scale", plan={"sm_scale": 0.05}, route=True),
            V("plan.logits_soft_cap", plan={"logits_soft_cap": 30.0}, route=True, jit="cap"),
            V("plan.window_left", plan={"window_left": 20}, jit="window"),
            V("plan.q_data_type", plan={"q_data_type": F16}, dtypes=(F16, F16), jit="fp16"),
        ],
        _cascade_call,
        "cascade_wrapper",
    )
    cap = {"logits_soft_cap": 30.0}
    out += _wrapper_cases(
        "flashinfer.attention.BatchAttention.run",
        "batch_attention_run_h32_kv8_d128_ps64",
        [
            V("base", route=True),
            V("plan.causal", plan={"causal": False}, route=True, jit="noncausal"),
            V("plan.sm_scale", plan={"sm_scale": 0.05}, route=True),
            V("plan.logits_soft_cap", plan=cap, run=cap, route=True, jit="cap",
              also=("logits_soft_cap",)),
            V("logits_soft_cap", run=cap),  # a cap the planned kernel has no room for
            V("out", run={"out": lambda c: torch.empty_like(c["q"]),
                          "lse": lambda c: torch.empty(c["q"].shape[:2], device=DEV)},
              route=True, also=("lse",)),
        ],  # fmt: skip
        _batch_attention_call,
        "batch_attention",
    )
    out += _wrapper_cases(
        "flashinfer.pod.PODWithPagedKVCacheWrapper.run",
        "pod_run_h32_kv8_d128_ps16",
        [
            V("base", route=True),
            V("causal_p", run={"causal_p": False}, route=True, jit="noncausal"),
            V("sm_scale_p", run={"sm_scale_p": 0.05}, plan={"sm_scale": 0.07}, route=True,
              also=("plan.sm_scale",)),
            V("window_left_p", run={"window_left_p": 3}, plan={"window_left": 9}, route=True,
              jit="window", also=("plan.window_left",)),
            V("kv_layout_p", run={"kv_layout_p": "HND"}, route=True, jit="hnd"),
            V("use_fp16_qk_reduction", run={"use_fp16_qk_reduction": True}, jit="fp16qk"),
            V("plan.q_data_type", plan={"q_data_type": F16}, dtypes=(F16, F16), jit="fp16"),
        ],  # fmt: skip
        _pod_call,
        "pod",
    )
    out += _wrapper_cases(
        "flashinfer.pod.BatchPODWithPagedKVCacheWrapper.run",
        "batch_pod_run_h32_kv8_d128_ps16",
        [
            V("base", route=True),
            V("causal_p", run={"causal_p": False}, route=True, jit="noncausal"),
            V("plan.sm_scale", plan={"sm_scale": 0.05}, route=True),
            V("plan.window_left", plan={"window_left": 9}, route=True, jit="window"),
            V("return_lse", run={"return_lse": True}),
        ],
        _batch_pod_call,
        "batch_pod",
    )
    return out


# ---------------------------------------------------------------------------------------
# TRT-LLM and XQA paged decode (XQA's kernels on SM90)
# ---------------------------------------------------------------------------------------


def _xqa_inputs(var: Var, seed: int, ps: int = 16) -> dict:
    """A batch of 4 one-token decodes over 16-token pages: block table, lengths, caches."""
    lay = _paged_layout(seed, 4, ps)
    k, v = lay["k"], lay["v"]
    if var.layout == "HND":
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    return {
        "tables": _block_tables(lay),
        "lens": _kv_lens(lay, ps),
        "k": k,
        "v": v,
        "ws": _workspace(zeroed=True),
    }


def _batch_decode_call(var: Var, fn: str) -> Callable[[], tuple]:
    def call() -> tuple:
        import flashinfer

        x = _xqa_inputs(var, 63)
        q = rnd(4, 32, 128, seed=64)
        cache = torch.stack([x["k"], x["v"]], dim=1) if var.stacked else (x["k"], x["v"])
        kw = {"bmm1_scale": 1 / math.sqrt(128), "kv_layout": var.layout}
        kw |= _values(var.run, {"q": q})
        lens = x["lens"]
        api = getattr(flashinfer.decode, fn)
        return _results(api(q, cache, x["ws"], x["tables"], lens, int(lens.max()), **kw))

    return call


def _xqa_call(var: Var) -> Callable[[], tuple]:
    def call() -> tuple:
        import importlib

        xqa = importlib.import_module("flashinfer.xqa").xqa  # flashinfer.xqa is the function
        x = _xqa_inputs(var, 66)
        q = rnd(4, 1, 32, 128, seed=67)
        out = torch.empty_like(q)
        semaphores = torch.zeros(1 << 20, dtype=torch.uint32, device=DEV)
        lens = x["lens"].unsqueeze(1).contiguous().view(torch.uint32)
        kw = {"kv_layout": var.layout, **_values(var.run, {"q": q})}
        args = (q, x["k"], x["v"], x["tables"], lens, out, x["ws"], semaphores, 8, 16)
        result = xqa(*args, **kw)
        return (out, torch.tensor(float(result is None)))

    return call


def _xqa_cases() -> list[Case]:
    V = Var
    out: list[Case] = []
    sinks = {"sinks": lambda c: rnd(32, dtype=F32, seed=65)}
    for fn, name, layout, other in (
        ("trtllm_batch_decode_with_kv_cache", "trtllm_batch_decode_h32_kv8_d128_ps16", "HND", "NHD"),
        ("xqa_batch_decode_with_kv_cache", "xqa_batch_decode_h32_kv8_d128_ps16", "NHD", "HND"),
    ):  # fmt: skip
        out += _wrapper_cases(
            f"flashinfer.decode.{fn}",
            name,
            [
                V("base", route=True, layout=layout),
                V("kv_layout", layout=other, route=True, jit=other),
                V("kv_cache", layout=layout, stacked=True, route=True),
                V("window_left", run={"window_left": 20}, route=True, layout=layout, jit="window"),
                V("sinks", run=sinks, route=True, layout=layout, jit="sinks"),
                # XQA reads no KV scale for a bfloat16 cache: refused (Note [XQA scales of a
                # 16-bit cache] in definitions/attention_trtllm.fidef).
                V("bmm2_scale", run={"bmm2_scale": 0.5}, layout=layout),
                V("out", run={"out": lambda c: torch.empty_like(c["q"])}, route=True,
                  layout=layout),
                V("o_scale", run={"o_scale": 2.0}, layout=layout),
            ],  # fmt: skip
            lambda var, fn=fn: _batch_decode_call(var, fn),
            fn,
        )
    xqa_sinks = {"sinks": lambda c: rnd(8, 4, dtype=F32, seed=68)}  # [kv heads, group]
    out += _wrapper_cases(
        "flashinfer.xqa.xqa",
        "xqa_h32_kv8_d128_ps16",
        [
            V("base", route=True),
            V("kv_layout", run={"kv_layout": "HND"}, layout="HND", route=True, jit="HND"),
            V("q_scale", run={"q_scale": 0.5}, route=True),
            V("sliding_win_size", run={"sliding_win_size": 21}, route=True, jit="window"),
            V("sinks", run=xqa_sinks, route=True, jit="sinks"),
            V("kv_scale", run={"kv_scale": 0.5}),
            V("rcp_out_scale", run={"rcp_out_scale": 2.0}),
        ],
        _xqa_call,
        "xqa",
    )
    return out


def _fmha_v2_call(var: Var, layout: str, kv_heads: int) -> Callable[[], tuple]:
    def call() -> tuple:
        import flashinfer

        lens = [7, 30, 3]  # queries are their sequence's own tokens
        cum = _indptr(lens)
        tokens = sum(lens)
        q = rnd(tokens, 32, 128, seed=69)
        k, v = rnd(tokens, kv_heads, 128, seed=70), rnd(tokens, kv_heads, 128, seed=71)
        qkv = {
            "PACKED_QKV": lambda: torch.stack([q, k, v], dim=1),
            "CONTIGUOUS_Q_KV": lambda: (q, torch.stack([k, v], dim=1)),
            "SEPARATE_Q_K_V": lambda: (q, k, v),
        }[layout]()
        ws = _workspace(zeroed=True)
        seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
        args = (qkv, layout, ws, seq_lens, max(lens), max(lens))
        kw = {"bmm1_scale": 1 / math.sqrt(128), "bmm2_scale": 1.0, "batch_size": 3}
        kw |= {"cum_seq_lens_q": cum, "cum_seq_lens_kv": cum, **_values(var.run, {"q": q})}
        return _results(flashinfer.prefill.trtllm_fmha_v2_prefill(*args, **kw))

    return call


def _fmha_v2_cases() -> list[Case]:
    V = Var
    api = "flashinfer.prefill.trtllm_fmha_v2_prefill"
    out: list[Case] = []
    for layout, kv_heads in (("PACKED_QKV", 32), ("CONTIGUOUS_Q_KV", 8), ("SEPARATE_Q_K_V", 8)):
        out += _wrapper_cases(
            api,
            f"trtllm_fmha_v2_prefill_h32_kv{kv_heads}_d128",
            [V(f"input_layout={layout}", route=True, jit=layout)],
            lambda var, layout=layout, kv_heads=kv_heads: _fmha_v2_call(var, layout, kv_heads),
            "fmha_v2",
        )
    out += _wrapper_cases(
        api,
        "trtllm_fmha_v2_prefill_h32_kv8_d128",
        [
            V("mask_mode", run={"mask_mode": "padding"}, route=True, jit="padding"),
            # SM90's 16-bit kernels read no bmm2_scale: refused (Note [FMHA v2 output scale]).
            V("bmm2_scale", run={"bmm2_scale": 0.5}, jit="CONTIGUOUS_Q_KV"),
            V("out", run={"out": lambda c: torch.empty_like(c["q"])}, route=True,
              jit="CONTIGUOUS_Q_KV"),
            V("save_softmax_stats", run={"save_softmax_stats": True}, jit="stats"),
            V("mask_mode", run={"mask_mode": "sliding_window", "window_left": 8},
              jit="window", also=("window_left",)),
        ],  # fmt: skip
        lambda var: _fmha_v2_call(var, "CONTIGUOUS_Q_KV", 8),
        "fmha_v2",
    )
    return out


def _needs_cudnn() -> str | None:
    """FlashInfer's cuDNN attention needs the cuDNN frontend (``import cudnn``)."""
    import flashinfer.cudnn.decode as cudnn_decode

    if cudnn_decode.CUDNN_AVAILABLE:
        return None
    return "the cuDNN frontend (pip install nvidia-cudnn-frontend) is not installed"


def _cudnn_call(var: Var, prefill: bool) -> Callable[[], tuple]:
    def call() -> tuple:
        import flashinfer

        ps = 16
        lay = _paged_layout(72, 3, ps)  # HND caches addressed by a block table
        k = lay["k"].transpose(1, 2).contiguous()
        v = lay["v"].transpose(1, 2).contiguous()
        tables, kv_lens = _block_tables(lay), _kv_lens(lay, ps)
        max_kv = int(tables.shape[1]) * ps
        ws = _workspace(zeroed=True)
        if prefill:
            q_lens = torch.minimum(kv_lens, torch.tensor([5, 1, 3], device=DEV)).to(torch.int32)
            q = rnd(int(q_lens.sum()), 32, 128, seed=73)
            kw = {"max_token_per_sequence": int(q_lens.max()), "max_sequence_kv": max_kv}
            kw |= {"actual_seq_lens_q": q_lens.reshape(3, 1, 1, 1)}
            kw |= {"actual_seq_lens_kv": kv_lens.reshape(3, 1, 1, 1), "block_tables": tables}
            # Three requests: FlashInfer asks for the packed rows' offsets (in elements).
            rows = _indptr(q_lens.tolist()) * 32 * 128
            kw |= {"batch_offsets_q": rows, "batch_offsets_o": rows}
            kw |= {"causal": True, "return_lse": False, **_values(var.run, {"q": q})}
            api = flashinfer.cudnn.prefill.cudnn_batch_prefill_with_kv_cache
        else:
            q = rnd(3, 32, 128, seed=74)
            kw = {"max_sequence_kv": max_kv, "actual_seq_lens_kv": kv_lens.reshape(3, 1, 1, 1)}
            kw |= {"block_tables": tables, **_values(var.run, {"q": q})}
            api = flashinfer.cudnn.decode.cudnn_batch_decode_with_kv_cache
        return _results(api(q, k, v, 1 / math.sqrt(128), ws, **kw))

    return call


def _cudnn_cases() -> list[Case]:
    V = Var
    sinks = {"sinks": lambda c: rnd(32, dtype=F32, seed=75)}
    decode = [
        V("base", route=True),
        V("window_left", run={"window_left": 20}, route=True),
        V("sinks", run=sinks, route=True),
        V("return_lse", run={"return_lse": True}, route=True),
        V("out", run={"out": lambda c: torch.empty_like(c["q"])}, route=True),
        # Offsets in elements of the packed rows themselves: the layout a routed call assumes,
        # refused all the same (the decode definition models no offsets).
        V("batch_offsets_q", run={"batch_offsets_q": lambda c: _indptr([1, 1, 1]) * 32 * 128}),
    ]
    prefill = [
        V("base", route=True),
        V("causal", run={"causal": False}, route=True),
        V("return_lse", run={"return_lse": True}),
    ]
    out: list[Case] = []
    for api, name, variations, is_prefill in (
        ("decode.cudnn_batch_decode_with_kv_cache", "cudnn_batch_decode_h32_kv8_d128_ps16",
         decode, False),
        ("prefill.cudnn_batch_prefill_with_kv_cache", "cudnn_batch_prefill_h32_kv8_d128_ps16",
         prefill, True),
    ):  # fmt: skip
        cases = _wrapper_cases(
            f"flashinfer.cudnn.{api}",
            name,
            variations,
            lambda var, p=is_prefill: _cudnn_call(var, p),
            "cudnn",
        )
        for case in cases:
            case.needs = _needs_cudnn
        out += cases
    return out


def _gdn_prefill_cases() -> list[Case]:
    """chunk_gated_delta_rule: SM90's chunked kernel over packed variable-length sequences."""
    out = []
    # (label, definition, keyword overrides, with an initial state, the rule it fails)
    grid = (
        ("3 sequences", "gdn_prefill_qk4_v8_d128", {}, True, None),
        ("no initial state", "gdn_prefill_qk4_v8_d128", {}, False, None),
        ("GVA 16 x 32", "gdn_prefill_qk16_v32_d128", {}, True, None),
        ("use_qk_l2norm_in_kernel", "gdn_prefill_qk4_v8_d128",
         {"use_qk_l2norm_in_kernel": True}, True, None),
        ("output_final_state=False", "gdn_prefill_qk4_v8_d128",
         {"output_final_state": False}, True, "output_final_state"),
    )  # fmt: skip
    for label, name, over, with_state, rule in grid:

        def call(name=name, over=over, with_state=with_state):
            import flashinfer.gdn_prefill

            x = _inputs(name, 91, total_seq_len=70, num_seqs=3, len_cu_seqlens=4)
            state = x["state"]
            if with_state and state is None:
                hv = x["v"].shape[1]
                state = rnd(3, hv, 128, 128, dtype=F32, seed=92, scale=0.1)
            kw = {"scale": float(x["scale"]), "initial_state": state if with_state else None}
            kw |= {"output_final_state": True, "cu_seqlens": x["cu_seqlens"], **over}
            args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
            return _results(flashinfer.gdn_prefill.chunk_gated_delta_rule(*args, **kw))

        out.append(
            Case(
                "flashinfer.gdn_prefill.chunk_gated_delta_rule",
                f"{name} {label}",
                call,
                {name: solution(name)},
                expect=rule,
                variant="gdn_prefill",
            )
        )
    return out


def _cutlass_moe_cases() -> list[Case]:
    """cutlass_fused_moe, unquantized bf16 (FlashInfer's SM90 CUTLASS grouped GEMMs)."""
    out = []
    # (definition, tokens, keyword overrides, the rule it fails)
    grid = (
        ("cutlass_fused_moe_e8_h256_i128_topk2", 5, {}, None),
        ("cutlass_fused_moe_e8_h256_i128_topk2", 64, {"use_fused_finalize": False}, None),
        ("cutlass_fused_moe_e128_h2048_i768_topk8", 16, {}, None),
        ("cutlass_fused_moe_e8_h256_i128_topk2", 5, {"ep_size": 2, "ep_rank": 1}, None),
        ("cutlass_fused_moe_e8_h256_i128_topk2", 5, {"swiglu_limit": "limit"}, "swiglu_limit"),
        # The engine's own output buffer (SGLang passes one): written, and returned first.
        ("cutlass_fused_moe_e8_h256_i128_topk2", 5, {"output": "buffer"}, None),
    )
    for name, tokens, over, rule in grid:

        def call(name=name, tokens=tokens, over=over):
            import flashinfer.fused_moe

            x = _inputs(name, 93, seq_len=tokens)
            experts = x["token_selected_experts"]
            if over.get("ep_rank"):  # global ids: this rank holds the second half of 16
                experts = experts + x["fc1_expert_weights"].shape[0]
            kw = {k: v for k, v in over.items() if k not in ("swiglu_limit", "output")}
            if "swiglu_limit" in over:
                kw["swiglu_limit"] = torch.full((len(x["fc1_expert_weights"]),), 7.0, device=DEV)
            if "output" in over:
                kw["output"] = torch.empty_like(x["input"])
            args = (x["input"], experts, x["token_final_scales"])
            args += (x["fc1_expert_weights"], x["fc2_expert_weights"], torch.bfloat16, [])
            # The output only: the list's other three tensors are filled in min-latency mode
            # alone (allocated, never written, otherwise).
            result = flashinfer.fused_moe.cutlass_fused_moe(*args, **kw)
            if "output" in kw and result[0] is not kw["output"]:
                raise AssertionError("the output returned is not the caller's buffer")
            return (result[0],)

        label = " ".join([f"{name} tokens={tokens}"] + [f"{k}={v}" for k, v in over.items()])
        out.append(
            Case(
                "flashinfer.fused_moe.cutlass_fused_moe",
                label,
                call,
                {name: solution(name)},
                expect=rule,
                variant="cutlass_moe",
            )
        )
    return out


GROUPS = {
    "norm": _norm_cases,
    "activation": _activation_cases,
    "cascade": _cascade_cases,
    "merge": _merge_more_cases,
    "single": _single_cases,
    "page": _page_cases,
    "rope": _rope_cases,
    "rope_fly": _rope_on_the_fly_cases,
    "rope_fp8": _rope_fp8_cases,
    "basic_more": _basic_more_cases,
    "norm_quant": _norm_quant_cases,
    "sampling": _sampling_cases,
    "sampling_more": _sampling_more_cases,
    "mamba": _mamba_cases,
    "mhc": _mhc_cases,
    "gdn": _gdn_cases,
    "moe": _moe_cases,
    "moe_routing": _moe_routing_cases,
    "rope_fp8_more": _rope_fp8_more_cases,
    "spec_topk": _speculative_and_top_k_cases,
    "bmm_fp8": _bmm_fp8_cases,
    "sm90_more": _sm90_more_cases,
    "moe_cute_dsl": _moe_cute_dsl_cases,
    "monomoe": _monomoe_cases,
    "decode": _decode_cases,
    "prefill": _prefill_cases,
    "ragged": _ragged_cases,
    "mla": _mla_cases,
    "attention_more": _attention_more_cases,
    "xqa": _xqa_cases,
    "fmha_v2": _fmha_v2_cases,
    "cudnn": _cudnn_cases,
    "gdn_prefill": _gdn_prefill_cases,
    "cutlass_moe": _cutlass_moe_cases,
}
# APIs whose cases are checked on the CPU (tests/test_flashinfer_conformance.py) but have
# not yet run against FlashInfer's kernels on a GPU; --list says so. Empty since the CUTLASS
# MoE's cases ran on an H200 against its fused-MoE module narrowed to bfloat16
# (benchmarks/narrow_cutlass_moe.py; benchmarks/README.md). An API added to the catalogue
# with cases no GPU has run goes here.
NOT_YET_ON_A_GPU: set[str] = set()


# APIs of the catalogue this suite has no case for yet, each with why. Their families'
# signatures, rules and references are checked on the CPU against the real package
# (tests/test_catalogue_*.py, tests/test_flashinfer_apply.py); ``--list`` names them, and
# tests/test_flashinfer_conformance.py fails for an API that is neither here nor in a group,
# and for one here that a group covers.
_SM100_ONLY = {
    # trtllm-gen, SM120 XQA / FMHA v2, cuDNN SM100, CuTe-DSL Blackwell kernels
    "trtllm_batch_context_with_kv_cache",
    "trtllm_batch_decode_with_kv_cache_mla",
    "trtllm_prefill_with_kv_cache_mla",
    "xqa_batch_decode_with_kv_cache_mla",
    "xqa_mla",
    "trtllm_ragged_attention_deepseek",
    "fmha_v2_prefill_sm120",
    "fmha_v2_prefill_deepseek",
    "msa_topk_select",
    # Blackwell CuTe-DSL paged MQA logits (SM100/SM103/SM107), SM120/SM121 MSA proxy passes
    "fp8_paged_mqa_logits",
    "fp4_paged_mqa_logits",
    "msa_proxy_score",
    "msa_proxy_score_fp4",
    "rmsnorm_sigmoid_gate",
    "gated_residual_rmsnorm",
    "gated_residual_next_rmsnorm",
    "nvfp4_kv_quantize",
    # FlashInfer's SM90 build of the FP4 quantizer writes zero values (no e2m1 conversion
    # below SM100); the SwiGLU one refuses pre-Blackwell GPUs.
    "fp4_quantize",
    "nvfp4_quantize",
    "silu_and_mul_nvfp4_quantize",
    "tgv_gemm_sm100",
    "mm_fp4",
    "mm_mxfp8",
    "gemm_fp8_nt_groupwise",
    "group_gemm_fp8_nt_groupwise_contiguous",
    "batch_deepgemm_fp8_nt_groupwise",
    "trtllm_bf16_moe",
    "trtllm_bf16_routed_moe",
    "trtllm_fp8_block_scale_routed_moe",
    "trtllm_fp8_per_tensor_scale_routed_moe",
    "trtllm_fp4_block_scale_moe",
    "trtllm_fp4_block_scale_routed_moe",
    "prims_ts_bf16_moe",
    "prims_ts_bf16_routed_moe",
    # Prims-TS runs on SM100/SM103/SM107; its partitioned forms on SM107 only.
    "prims_ts_fp4_block_scale_moe",
    "prims_ts_fp4_block_scale_routed_moe",
    "prims_ts_fp8_per_tensor_scale_moe",
    "prims_ts_bf16_moe_partitioned",
    "prims_ts_fp8_per_tensor_scale_moe_partitioned",
    "prims_ts_fp4_block_scale_moe_partitioned",
    "prims_ts_fp8_block_scale_moe",
    "prims_ts_fp8_block_scale_routed_moe",
    "prims_ts_fp8_block_scale_moe_partitioned",
    # CuTe-DSL block-scaled MoE: SM100/SM103 (and SM107 for W4A4).
    "cute_dsl_fused_moe",
    "cute_dsl_fused_moe_nvfp4",
    "cute_dsl_fused_moe_mxfp8_mxfp4",
    # AlphaMoE's W8A8 and NVFP4 megakernels: SM100/SM103; trtllm-gen MXINT4: SM100.
    "alphamoe_fp8_block_scale_aligned_moe",
    "alphamoe_nvfp4_aligned_moe",
    "alphamoe_nvfp4_routed_moe",
    "trtllm_mxint4_block_scale_moe",
    "gated_delta_rule_replayssm_commit",
    "chunk_gated_delta_rule2",
    "chunk_gated_delta_product",
    "recurrent_kda",
    "packed_kda_decode",
    "fused_kda_decode",
    "packed_fused_kda_decode",
    "msa_sparse_attention",
    "msa_sparse_decode_attention",
    "ssd_combined_fwd",
    # The DeepSeek-V4.1 sparse-MLA cache writers: a module built for SM120 only.
    "dsv41_fp4_quantize_pack_sparse_mla_cache",
    "dsv41_fp4_quantize_append_sparse_mla_cache",
    "dsv41_fp8_quantize_pack_sparse_mla_cache",
    "dsv41_fp8_quantize_append_sparse_mla_cache",
    # SageAttention 3's NVFP4 attention: a module built for SM120/SM121 only.
    "nvfp4_attention_sm120_quantize_qkv",
    "nvfp4_attention_sm120_fwd",
    # MX quantizers: the SM90 build compiles and launches, but the kernel's body is compiled
    # for SM100 only (`#if __CUDA_ARCH__ >= 1000` in quantization.cuh), so nothing is written.
    "mxfp8_quantize",
    "mxfp4_quantize",
    "mxfp8_grouped_quantize",
    # FP4 and MXFP8 GEMMs, quantizers and activations whose every backend needs SM100+/SM120
    "bmm_mxfp8",
    "mm_bf16_fp4",
    "grouped_gemm_nt_masked",
    "mm_nvfp4_svdquant",
    "svdquant_linear",
    "nvfp4_quantize_smooth",
    "rmsnorm_fp4quant",
    "add_rmsnorm_fp4quant",
    "silu_and_mul_scaled_nvfp4_experts_quantize",
    "silu_and_mul_mxfp8_quantize",
    "silu_and_mul_mxfp8_quantize_backward",
    # MiniMax-H3 (SM100a/SM103a), b12x MoE (SM120/SM121), CuTe-DSL block-scaled MoE wrappers
    "MiniMaxH3Mxfp8PreAttention.run",
    "MiniMaxH3Nvfp4PreAttention.run",
    "MiniMaxH3QkvQuantizePack.run",
    "minimax_h3_bf16_pre_attention",
    "b12x_fused_moe",
    "B12xMoEWrapper.run",
    "CuteDslMoEWrapper.run",
    "CuteDslMxfp8Mxfp4MoEWrapper.run",
    # Prims-TS attention and CAKE VSA: SM100/SM103/SM107
    "BlockSparsePagedTSWrapper.run",
    "BlockSparseTSWrapper.run",
    "block_sparse_attention",
    "block_sparse_attention_with_paged_kv_cache",
    "BatchDecodePagedTSWrapper.run",
    "BatchMLADecodePagedTSWrapper.run",
    "batch_mla_decode_with_paged_kv_cache",
    "decode.batch_decode_with_paged_kv_cache",
    "run_cake_vsa",
    # CuTe-DSL attention wrappers: Blackwell kernels
    "BatchMLADecodeCuteDSLWrapper.run",
    "BatchPrefillCuteDSLWrapper.run",
}


def _kernel_name(api: str) -> tuple[str, str]:
    """The names an API goes by in _SM100_ONLY: its function, and ``Class.method``."""
    return api.rsplit(".", 1)[-1], ".".join(api.rsplit(".", 2)[-2:])


def _pending() -> dict[str, str]:
    covered = {c.api for group in GROUPS for c in GROUPS[group]()}
    apis = {f.api.path for f in FAMILIES.values() if f.api is not None} - covered
    return {
        api: (
            "its kernel runs only on SM100/SM120, not on an H100"
            if _SM100_ONLY & set(_kernel_name(api))
            else "no GPU case written yet"
        )
        for api in sorted(apis)
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


def _synchronize() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def _apply_on(case: Case, strict: bool = False) -> tuple[tuple | None, str | None, dict]:
    """The call with apply on: its results (or error) and the API's counts."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.enable_apply(case.solutions, strict=strict)
    on, error, extra = None, None, {}
    try:
        on = _results(case.call())
        _synchronize()
    except Exception as exc:
        error = _error(exc)
        extra["traceback"] = traceback.format_exc()[-1500:]
    counts = _stats_of(case.api)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.disable_apply()
    return on, error, {"counts": counts, **extra}


def _routing(outcome: Outcome, counts: dict) -> None:
    outcome.routed = counts.get("hit", 0) > 0
    rules = counts.get("rules", {})
    outcome.rule = ",".join(sorted(rules)) if rules else None


def _unservable(case: Case, reason: str) -> Outcome:
    """A case this GPU cannot run: only apply on, strict, so that FlashInfer is not called."""
    outcome = Outcome(case.label, not_run=reason)
    _, error, extra = _apply_on(case, strict=True)
    counts = extra.pop("counts")
    outcome.extra.update(extra)
    _routing(outcome, counts)
    if case.expect is None and not outcome.routed:
        outcome.failure = f"not routed: {error or counts}"
    elif case.expect is None and error:
        outcome.failure = f"routed, but apply on raised: {error}"
    elif case.expect is not None and (outcome.routed or outcome.rule != case.expect):
        # Strict mode raised instead of calling FlashInfer; the rule is in the counts.
        outcome.failure = f"expected a refusal by {case.expect}, got {counts}"
    return outcome


def run_case(case: Case) -> Outcome:
    reason = case.needs() if case.needs is not None and DEV == "cuda" else None
    if reason is not None:
        return _unservable(case, reason)
    outcome = Outcome(case.label)
    try:
        off = _results(case.call())
        _synchronize()
    except Exception as exc:
        off, outcome.error_off = None, _error(exc)
    on, outcome.error_on, extra = _apply_on(case)
    counts = extra.pop("counts")
    outcome.extra.update(extra)
    _routing(outcome, counts)
    if counts.get("error"):
        outcome.failure = f"a solution error was counted ({counts})"
    elif outcome.error_on and not outcome.error_off:
        outcome.failure = f"apply on raised where apply off did not: {outcome.error_on}"
    elif outcome.error_off:
        # FlashInfer cannot make this call here (or refuses it): nothing to compare with.
        # Apply on must have raised alike, unless it routed the call.
        if outcome.error_on and outcome.error_on.split(":")[0] != outcome.error_off.split(":")[0]:
            outcome.failure = f"apply on raised {outcome.error_on}, FlashInfer {outcome.error_off}"
        else:
            alike = "apply on raised alike" if outcome.error_on else "apply on routed it"
            outcome.not_run = f"FlashInfer raised {outcome.error_off} ({alike})"
        if case.expect is None and not outcome.routed and not outcome.error_on:
            outcome.failure = f"not routed ({counts})"
        elif case.expect is not None and outcome.routed:
            outcome.failure = f"routed, though it should fall back by {case.expect}"
        elif case.expect is not None and outcome.rule != case.expect:
            outcome.failure = f"expected a fallback by {case.expect}, got {counts}"
        return outcome
    elif case.expect is None and not outcome.routed:
        outcome.failure = f"not routed ({counts})"
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
    if (
        outcome.failure is not None
        and outcome.failure.startswith("result ")
        and _unstable(case, off)
    ):
        # FlashInfer itself gives another result for the same call: for this input its
        # output is not defined (a plan that contradicts the run, say), so apply on cannot
        # be held to it.
        outcome.not_run = (
            "FlashInfer's own result differs between two identical calls; "
            f"apply on {'routed' if outcome.routed else 'fell back'}"
        )
        outcome.failure = None
    return outcome


def _unstable(case: Case, off: list) -> bool:
    """Whether FlashInfer, called again with apply off, gives other bytes than ``off``."""
    try:
        again = _results(case.call())
        _synchronize()
    except Exception:
        return True
    for a, b in zip(again, off):
        if isinstance(a, torch.Tensor) and not torch.equal(a.nan_to_num(), b.nan_to_num()):
            return True
    return len(again) != len(off)


# Parameters whose stand-in values FlashInfer reads as device memory of its own layout
# (multi-item scoring): on a GPU its kernel can fault on them, which ends the CUDA context
# for every later case; they run last.
_FAULTING = ("prefix_len_ptr", "token_pos_in_items", "max_item_len_ptr")


def _faulting_last(cases: list[Case]) -> list[Case]:
    return sorted(cases, key=lambda c: any(f in c.label for f in _FAULTING))


def _sticky(outcome: Outcome) -> bool:
    errors = f"{outcome.error_off} {outcome.error_on}"
    return "illegal memory access" in errors or "AcceleratorError" in errors


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


# ``--cases``: a regular expression a case's label must contain to be built and run.
CASE_FILTER: re.Pattern[str] | None = None


def _cases(group: str) -> list[Case]:
    """A group's cases, those ``--cases`` selects."""
    cases = GROUPS[group]()
    return cases if CASE_FILTER is None else [c for c in cases if CASE_FILTER.search(c.label)]


def prebuild(workers: int, groups: list[str], deadline: float) -> set[str]:
    """Build each kernel variant once, in ``workers`` processes; the variants not built.

    One case per variant is called with apply off; a variant whose call did not return by
    the deadline is reported, and its cases are not run (a call that hangs would stop the
    run). Cases FlashInfer cannot run on this GPU (``needs``) are not called.
    """
    import multiprocessing as mp

    jobs: dict[str, tuple[str, str]] = {}
    for g_ in groups:
        for c in _cases(g_):
            if c.needs is not None and c.needs() is not None:
                continue
            jobs.setdefault(c.variant or c.label, (g_, c.label))
    variant_of = {label: variant for variant, (_, label) in jobs.items()}
    pending = set(variant_of)
    start = time.time()
    pool = mp.get_context("spawn").Pool(workers)
    try:
        results = pool.imap_unordered(_prebuild_one, list(jobs.values()))
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
    print(f"prebuild: {len(jobs)} variants in {time.time() - start:.0f} s", flush=True)
    return {variant_of[label] for label in pending}


# ---------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="groups: " + ", ".join(GROUPS),
    )
    parser.add_argument("--only", nargs="*", default=[], help="groups to run: " + ", ".join(GROUPS))
    parser.add_argument("--json", help="write every case's figures here")
    parser.add_argument("--prebuild", type=int, default=0, help="processes that JIT-build first")
    parser.add_argument(
        "--deadline", type=float, default=300.0, help="seconds the prebuild may take"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds after which no case is started (the rest are reported as not run)",
    )
    parser.add_argument(
        "--cases",
        metavar="REGEX",
        help="only the cases whose label this regular expression matches (searched)",
    )
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument(
        "--interleave-alone",
        action="store_true",
        help="build FlashInfer's SM90 weight-interleave kernels without its whole fused-MoE"
        " module, and call them through FlashInfer's own functions",
    )
    args = parser.parse_args()
    if importlib.util.find_spec("flashinfer") is None:
        print(
            "error: needs flashinfer-python 0.7.2 (pip install --no-deps"
            " flashinfer-python==0.7.2.post1, with the import dependencies .ci/run installs)",
            file=sys.stderr,
        )
        return 2
    global INTERLEAVE_ALONE, DEV, CASE_FILTER
    INTERLEAVE_ALONE = INTERLEAVE_ALONE or args.interleave_alone
    if INTERLEAVE_ALONE:
        os.environ["FIBGEN_INTERLEAVE_ALONE"] = "1"
    unknown = [o for o in args.only if not any(o in g_ for g_ in GROUPS)]
    if unknown:
        print(f"error: no group matches {', '.join(unknown)}; groups: {', '.join(GROUPS)}")
        return 2
    groups = [g_ for g_ in GROUPS if not args.only or any(o in g_ for o in args.only)]
    if args.list and not torch.cuda.is_available():
        DEV = "cpu"  # listing makes each case's inputs, and calls nothing
    elif DEV == "cuda" and not torch.cuda.is_available():
        print("error: needs a CUDA GPU and flashinfer-python 0.7.2 with its JIT", file=sys.stderr)
        return 2
    # Each group's cases, made once where they are selected or listed; a run makes each
    # group's as it reaches it, so that one group's inputs at a time are on the GPU.
    made: dict[str, list[Case]] = {}
    if args.cases:
        try:
            CASE_FILTER = re.compile(args.cases)
        except re.error as e:
            print(f"error: --cases {args.cases!r} is not a regular expression: {e}")
            return 2
        made = {g_: cases for g_ in groups if (cases := _cases(g_))}
        if not made:
            print(f"error: --cases {args.cases!r} matches no case of {', '.join(groups)}")
            return 2
        groups = list(made)
    if args.list:
        for group in groups:
            cases = made.get(group) or _cases(group)
            for case in cases:
                expect = f"falls back by {case.expect}" if case.expect else "routed"
                print(f"{group}: {case.label}: {expect}")
            made[group] = cases
        for api, why in _pending().items():
            print(f"no case: {api}: {why}")
        for group in groups:
            pending = Counter(c.api for c in made[group] if c.api in NOT_YET_ON_A_GPU)
            for api, n in pending.items():
                print(f"not yet run on a GPU: {api} ({n} cases, group {group})")
        return 0
    started = time.time()
    gpu = torch.cuda.get_device_name() if DEV == "cuda" else "cpu"
    print(f"device: {gpu}, torch {torch.__version__}", flush=True)
    hung: set[str] = set()
    if args.prebuild:
        hung = prebuild(args.prebuild, groups, args.deadline)
    results: dict[str, list[dict]] = {}
    failures = not_run = 0
    broken = None  # the case after which the CUDA context is unusable
    for group in groups:
        by_api: dict[str, list[Outcome]] = {}
        for case in _faulting_last(made.pop(group, None) or _cases(group)):
            start = time.time()
            if (case.variant or case.label) in hung:
                # A call that did not return while building would stop the run here.
                outcome = Outcome(case.label, not_run="its kernels did not build in time")
            elif args.budget is not None and start - started > args.budget:
                outcome = Outcome(case.label, not_run=f"out of time (--budget {args.budget:g})")
            elif broken is not None:
                outcome = Outcome(case.label, not_run=f"the CUDA context was lost at {broken}")
            elif DEV == "cuda" and any(f in case.label for f in _FAULTING):
                # FlashInfer reads these stand-ins as its multi-item-scoring metadata and
                # faults (an illegal address, or SIGFPE) on them; apply on is checked alone.
                outcome = _unservable(case, "FlashInfer faults on stand-in multi-item metadata")
            else:
                outcome = run_case(case)
                if _sticky(outcome):
                    # An illegal address is sticky: every later call in this process fails.
                    broken = f"{case.label!r} ({outcome.error_off or outcome.error_on})"[:160]
            outcome.extra["seconds"] = round(time.time() - start, 2)
            by_api.setdefault(case.api, []).append(outcome)
            failures += outcome.failure is not None
            not_run += outcome.failure is None and outcome.not_run is not None
            print(_line(case, outcome), flush=True)
        for api, outcomes in by_api.items():
            _table(api, outcomes)
            results[api] = [o.__dict__ for o in outcomes]
        if args.json:  # after every group: a run stopped later keeps what it measured
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    if "norm" not in groups:  # the overhead rows call FlashInfer's rmsnorm
        return _finish(results, failures, not_run, args.json)
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
    return _finish(results, failures, not_run, args.json)


def _line(case: Case, outcome: Outcome) -> str:
    if outcome.failure:
        mark, why = "FAIL", outcome.failure
    elif outcome.not_run:
        mark, why = "not run", outcome.not_run
    else:
        mark, why = "ok", ""
    expect = f"expect {case.expect}" if case.expect else "expect routed"
    return (
        f"  [{mark}] {case.label}: {expect}; routed={outcome.routed} rule={outcome.rule} "
        f"max_abs={outcome.max_abs:.3g} {why}"
    )


def _finish(results: dict, failures: int, not_run: int, path: str | None) -> int:
    if path:
        Path(path).write_text(json.dumps(results, indent=1, default=str))
    tail = f", {not_run} case(s) not run (reasons above)" if not_run else ""
    print(f"\n{failures} failure(s){tail}")
    return 1 if failures else 0


def _table(api: str, outcomes: list[Outcome]) -> None:
    routed = sum(o.routed for o in outcomes)
    rules: dict[str, int] = {}
    for o in outcomes:
        if o.rule and not o.routed:
            rules[o.rule] = rules.get(o.rule, 0) + 1
    worst = max((o.max_abs for o in outcomes), default=0.0)
    failed = sum(o.failure is not None for o in outcomes)
    skipped = [o for o in outcomes if o.failure is None and o.not_run]
    fell = ", ".join(f"{k}: {v}" for k, v in sorted(rules.items())) or "-"
    print(
        f"\n{api}\n  cases {len(outcomes)}  routed {routed}  fell back by rule {fell}  "
        f"max error {worst:.3g}  failures {failed}  not run {len(skipped)}",
        flush=True,
    )
    reasons: dict[str, int] = {}
    for o in skipped:
        reasons[o.not_run] = reasons.get(o.not_run, 0) + 1
    for reason, n in sorted(reasons.items()):
        print(f"    not run ({n}): {reason}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
