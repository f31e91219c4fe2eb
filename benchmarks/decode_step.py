"""A decode step of a small Llama-shaped model, with apply off and on, eager and CUDA graph.

    python benchmarks/decode_step.py [--layers 4] [--batches 1,8,32,64,128,256]

Needs a CUDA GPU and flashinfer-python. Each layer: ``flashinfer.norm.rmsnorm`` (first
layer) or ``flashinfer.norm.fused_add_rmsnorm``, the QKV GEMM, paged decode attention through
``flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper`` (page size 16, 500 tokens of context
per request, so last pages are partial), the output GEMM, ``fused_add_rmsnorm``, the gate/up
GEMM, ``flashinfer.activation.silu_and_mul`` and the down GEMM; then a final norm and the
LM head (vocabulary 32000). Shapes are Llama 3 8B's (hidden 4096, 32 query and 8 KV heads of
128, intermediate 14336, bf16, eps 1e-5); there is no rotary embedding, which both sides
would run alike.

Apply off runs FlashInfer's own norm and activation kernels; apply on routes them to the
shipped Triton solutions (``enable_apply`` patches FlashInfer). Attention has no solution in
that dataset: its calls go to FlashInfer, counted as misses. Apply stays on, and the "off" step
calls FlashInfer's own functions, taken before apply patched them: so both steps are timed in
turn within each of 21 rounds (``eager_rounds``: back-to-back steps for about 40 ms and then
80 ms each, off and on in turn, a quarter of a second a round; a round's fixed start and end
taken out), eagerly and as replayed CUDA graphs. The table gives medians
over the rounds, ratios paired per round with their quartiles, and the largest logit
difference between off and on. The target: apply
on is never slower, and its logits are within bf16 tolerance of apply off's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fibgen.bench.eager import eager_rounds, per_call  # noqa: E402

from _shipped import routes  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB = 4096, 32, 8, 128, 14336, 32000
EPS, PAGE, CONTEXT = 1e-5, 16, 500
WORKSPACE = 128 << 20
ROUNDS = 21  # rounds of eager_rounds: apply off and on timed in turn in each
# A round's shorter timing, in ms: an eager step of 0.5 to 0.7 ms gets about 60 steps in it (5 ms
# rounds held 7, whose spread was the host's jitter over a handful of steps).
ROUND_MS = 40.0


class Model:
    """Weights, a paged KV cache per layer and one decode wrapper per batch size."""

    def __init__(self, layers: int, max_batch: int, page: int = PAGE) -> None:
        gen = torch.Generator(device="cuda").manual_seed(0)

        def w(*shape):
            return (torch.randn(*shape, device="cuda", generator=gen) / shape[-1] ** 0.5).bfloat16()

        qkv = (HEADS + 2 * KV_HEADS) * HEAD_DIM
        self.layers = [
            {
                "in_norm": w(HIDDEN) + 1,
                "qkv": w(qkv, HIDDEN),
                "o": w(HIDDEN, HEADS * HEAD_DIM),
                "post_norm": w(HIDDEN) + 1,
                "gate_up": w(2 * INTER, HIDDEN),
                "down": w(HIDDEN, INTER),
            }
            for _ in range(layers)
        ]
        self.final_norm = w(HIDDEN) + 1
        self.lm_head = w(VOCAB, HIDDEN)
        self.page = page
        pages = (CONTEXT + page - 1) // page
        shape = (max_batch * pages, page, KV_HEADS, HEAD_DIM)
        self.caches = [
            (
                torch.randn(shape, device="cuda", generator=gen).bfloat16(),
                torch.randn(shape, device="cuda", generator=gen).bfloat16(),
            )
            for _ in range(layers)
        ]
        self.pages = pages

    def wrapper(self, batch: int, graph: bool):
        """A decode wrapper planned for ``batch`` requests of CONTEXT tokens."""
        import flashinfer

        indptr = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * self.pages
        indices = torch.arange(batch * self.pages, dtype=torch.int32, device="cuda")
        last = torch.full((batch,), CONTEXT - (self.pages - 1) * self.page, dtype=torch.int32)
        last = last.cuda()
        workspace = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")
        extra = {}
        if graph:
            extra = {
                "use_cuda_graph": True,
                "paged_kv_indptr_buffer": indptr.clone(),
                "paged_kv_indices_buffer": indices.clone(),
                "paged_kv_last_page_len_buffer": last.clone(),
            }
        wrapper = flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", **extra)
        wrapper.plan(
            indptr,
            indices,
            last,
            HEADS,
            KV_HEADS,
            HEAD_DIM,
            self.page,
            q_data_type=torch.bfloat16,
            kv_data_type=torch.bfloat16,
        )
        return wrapper

    def step(self, x, wrapper, ops):
        """One decode step: hidden states [batch, hidden] to logits [batch, vocab]; ``ops``:
        the norm and activation functions to call (FlashInfer's own, or patched)."""
        batch = x.shape[0]
        residual = None
        h = x
        for layer, cache in zip(self.layers, self.caches):
            if residual is None:
                residual = h
                h = ops.rmsnorm(h, layer["in_norm"], EPS)
            else:
                ops.fused_add_rmsnorm(h, residual, layer["in_norm"], EPS)
            qkv = h @ layer["qkv"].T
            q = qkv[:, : HEADS * HEAD_DIM].reshape(batch, HEADS, HEAD_DIM)
            attn = ops.attention(wrapper, q, cache)
            h = attn.reshape(batch, HEADS * HEAD_DIM) @ layer["o"].T
            ops.fused_add_rmsnorm(h, residual, layer["post_norm"], EPS)
            h = ops.silu_and_mul(h @ layer["gate_up"].T) @ layer["down"].T
        ops.fused_add_rmsnorm(h, residual, self.final_norm, EPS)
        return h @ self.lm_head.T


class Ops(NamedTuple):
    """The functions a step calls for its norms, activation and attention."""

    rmsnorm: Callable
    fused_add_rmsnorm: Callable
    silu_and_mul: Callable
    attention: Callable  # (wrapper, q, cache) -> output

    @classmethod
    def now(cls) -> Ops:
        """FlashInfer's functions as its modules hold them now (patched while apply is on)."""
        import flashinfer

        norm = flashinfer.norm
        run = flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run
        return cls(
            norm.rmsnorm,
            norm.fused_add_rmsnorm,
            flashinfer.activation.silu_and_mul,
            lambda wrapper, q, cache: run(wrapper, q, cache),
        )


def graphed(model: Model, batch: int, x: torch.Tensor, ops: Ops):
    """(replay, logits): a step at ``batch`` captured in a CUDA graph, and a replay of it."""
    wrapper = model.wrapper(batch, graph=True)
    static = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            model.step(static.clone(), wrapper, ops)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    work = static.clone()
    with torch.cuda.graph(graph):
        logits = model.step(work, wrapper, ops)

    def replay():
        work.copy_(static)
        graph.replay()

    # The captured attention reads the wrapper's buffers: they live as long as the graph.
    replay.wrapper = wrapper
    replay()
    torch.cuda.synchronize()
    return replay, logits


def measure(model: Model, batch: int, off: Ops, on: Ops) -> dict:
    """Per-round eager and CUDA-graph costs of a step at ``batch`` with apply off and on, and
    the logits of each (apply is on: ``off`` holds FlashInfer's own functions)."""
    gen = torch.Generator(device="cuda").manual_seed(batch)
    x = torch.randn(batch, HIDDEN, device="cuda", generator=gen).bfloat16()
    wrapper = model.wrapper(batch, graph=False)
    logits = {"off": model.step(x.clone(), wrapper, off), "on": model.step(x.clone(), wrapper, on)}
    from fibgen.runtime.launch import replay

    replay.wait_native(strict=True)  # routed launches timed as a settled process makes them
    eager = eager_rounds(
        {
            "off": lambda: model.step(x.clone(), wrapper, off),
            "on": lambda: model.step(x.clone(), wrapper, on),
        },
        rounds=ROUNDS,
        round_ms=ROUND_MS,
    )
    replays = {}
    for key, ops in (("off", off), ("on", on)):
        replays[key], graph_logits = graphed(model, batch, x, ops)
        diff = (graph_logits.float() - logits[key].float()).abs().max().item()
        assert diff < 0.5, f"apply {key}: the graph's logits differ from eager by {diff}"
    # Replayed in turn too: the GPU's clock drifts as it warms up over a run.
    graph = eager_rounds(replays, rounds=ROUNDS, round_ms=ROUND_MS)
    return {"eager": eager, "graph": graph, "logits": logits}


class Paired(NamedTuple):
    """Apply off and on over paired rounds: medians in µs, and on / off paired per round (its
    median and quartiles)."""

    off: float
    on: float
    ratio: float
    low: float
    high: float

    def spread(self) -> str:
        """The ratio and the quartiles of the per-round ratios, as the tables print them."""
        return f"{self.ratio:.2f} ({self.low:.2f}-{self.high:.2f})"


def paired(costs: dict) -> Paired:
    """Apply off and on: medians over the rounds, the ratio paired per round."""
    off = statistics.median(per_call(c) for c in costs["off"])
    on = statistics.median(per_call(c) for c in costs["on"])
    ratios = [per_call(b) / per_call(a) for a, b in zip(costs["off"], costs["on"])]
    low, _, high = statistics.quantiles(ratios, n=4)
    return Paired(off, on, statistics.median(ratios), low, high)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batches", default="1,8,32,64,128,256")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: benchmarks/decode_step.py needs a CUDA GPU")
    import fibgen.runtime as rt

    batches = [int(b) for b in args.batches.split(",")]
    model = Model(args.layers, max(batches))
    table = routes(HIDDEN, INTER)
    print(f"decode step, {args.layers} Llama-3-8B-shaped layers, {torch.cuda.get_device_name()}")
    print(
        f"{'batch':>5} {'eager off µs':>12} {'eager on µs':>11} {'ratio (quartiles)':>17} "
        f"{'graph off µs':>12} {'graph on µs':>11} {'ratio (quartiles)':>17} {'max logit diff':>14}"
    )
    off = Ops.now()  # FlashInfer's own functions, taken before apply patches them
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.enable_apply(table)
    try:
        on = Ops.now()
        for batch in batches:
            figures = measure(model, batch, off, on)
            eager, graph = paired(figures["eager"]), paired(figures["graph"])
            logits = figures["logits"]
            diff = (logits["on"].float() - logits["off"].float()).abs().max().item()
            print(
                f"{batch:>5} {eager.off:12.1f} {eager.on:11.1f} {eager.spread():>17} "
                f"{graph.off:12.1f} {graph.on:11.1f} {graph.spread():>17} {diff:14.4f}"
            )
        stats = rt.stats()
    finally:
        rt.disable_apply()
    for api in ("flashinfer.norm.fused_add_rmsnorm", "flashinfer.activation.silu_and_mul"):
        assert stats[api]["hit"] > 0, f"{api} was not routed"
    off_logits = logits["off"]
    print(f"logit scale: the logits' largest magnitude is {off_logits.abs().max().item():.2f}")


if __name__ == "__main__":
    main()
