"""Routed calls under torch.compile and CUDA graphs: compile time, breaks, recompiles, µs/call.

    python benchmarks/compile.py [--batch 8] [--calls 300]

Needs a CUDA GPU and flashinfer-python. The model is a piece of a Llama-shaped decoder layer
(hidden 4096, intermediate 14336, bf16) that calls FlashInfer's ``rmsnorm``,
``fused_add_rmsnorm`` and ``silu_and_mul`` between two torch GEMMs. It runs unrouted
(FlashInfer's own kernels) and routed (``enable_apply`` over the shipped Triton solutions,
FlashInfer patched), each

- eagerly,
- compiled (``torch.compile(dynamic=True)``, inductor; ``fullgraph=True`` where the model
  traces without a break),
- compiled with ``mode="reduce-overhead"`` (inductor's CUDA graphs),
- captured by hand in a ``torch.cuda.CUDAGraph`` and replayed.

Columns: the first call's time (compile and capture included), graph breaks
(``torch._dynamo.explain``), graphs compiled again over ``--calls`` calls of random batch
sizes 2..64, the steady-state µs per call at ``--batch`` rows (``time_eager``: back-to-back
calls), and the largest difference from unrouted eager on the same inputs.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fibgen.bench.eager import time_eager  # noqa: E402

from _shipped import routes  # noqa: E402

HIDDEN, INTER, EPS = 4096, 14336, 1e-5


def make_model():
    import flashinfer

    gen = torch.Generator(device="cuda").manual_seed(0)

    def weight(*shape):
        return (torch.randn(*shape, device="cuda", generator=gen) / shape[-1] ** 0.5).bfloat16()

    w_norm, w_post = weight(HIDDEN) + 1, weight(HIDDEN) + 1
    w_up, w_down = weight(2 * INTER, HIDDEN), weight(HIDDEN, INTER)

    def model(x, residual):
        h = flashinfer.norm.rmsnorm(x, w_norm, EPS)
        g = flashinfer.activation.silu_and_mul(h @ w_up.T)
        y = g @ w_down.T
        flashinfer.norm.fused_add_rmsnorm(y, residual, w_post, EPS)
        return y, residual

    return model


def inputs(batch, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(batch, HIDDEN, device="cuda", generator=gen).bfloat16()
    return x, torch.randn(batch, HIDDEN, device="cuda", generator=gen).bfloat16()


def unique_graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def graph_of(model, batch):
    """A hand-captured CUDA graph of ``model`` on static inputs; returns (replay, outputs)."""
    x, r = inputs(batch)
    static_x, static_r = x.clone(), r.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up: routes resolved, kernels compiled, before capture
            model(static_x.clone(), static_r.clone())
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    work_r = static_r.clone()
    with torch.cuda.graph(graph):
        out = model(static_x, work_r)

    def replay():
        work_r.copy_(static_r)  # fused_add_rmsnorm updates the residual in place
        graph.replay()

    return replay, out


def run_mode(model, mode, batch, calls, want):
    """One row: (first call s, graph breaks, recompiles, µs per call, max diff)."""
    import torch._dynamo

    torch._dynamo.reset()
    x, r = inputs(batch)
    breaks, recompiles = "-", "-"
    start = time.perf_counter()
    if mode == "eager":
        fn = model
        out = fn(x, r.clone())
    elif mode == "cuda graph":
        replay, out = graph_of(model, batch)
        replay()
        fn = None
    else:
        explained = torch._dynamo.explain(model)(x, r.clone())
        breaks = explained.graph_break_count
        torch._dynamo.reset()
        # FlashInfer's own APIs do not trace (their JIT loader stats files): unrouted, the
        # model compiles in pieces around them.
        options = {"fullgraph": breaks == 0, "dynamic": True}
        if mode == "reduce-overhead":
            options["mode"] = "reduce-overhead"
        fn = torch.compile(model, **options)
        out = fn(x, r.clone())
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(out, want))
    if mode in ("compiled", "reduce-overhead"):
        before = unique_graphs()
        rng = random.Random(0)
        for _ in range(calls):
            b = rng.randint(2, 64)
            xb, rb = inputs(b, seed=b)
            fn(xb, rb)
        torch.cuda.synchronize()
        recompiles = unique_graphs() - before
    if fn is None:
        us = time_eager(replay)
    else:
        us = time_eager(lambda: fn(x, r.clone()))
    return first, breaks, recompiles, us, diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: benchmarks/compile.py needs a CUDA GPU")
    import fibgen.runtime as rt

    model = make_model()
    x, r = inputs(args.batch)
    want = model(x, r.clone())
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, batch {args.batch}")
    print(
        f"{'apply':8s} {'mode':16s} {'first call s':>12} {'breaks':>6} {'recompiles':>10} "
        f"{'µs/call':>9} {'max diff':>9}"
    )
    table = routes(HIDDEN, INTER)
    for routed in (False, True):
        if routed:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                rt.enable_apply(table)
        for mode in ("eager", "compiled", "reduce-overhead", "cuda graph"):
            first, breaks, recompiles, us, diff = run_mode(
                model, mode, args.batch, args.calls, want
            )
            print(
                f"{'on' if routed else 'off':8s} {mode:16s} {first:12.2f} {breaks!s:>6} "
                f"{recompiles!s:>10} {us:9.1f} {diff:9.4f}"
            )
        if routed:
            stats = rt.stats()
            hits = {api: s["hit"] for api, s in stats.items() if s.get("hit")}
            print(f"routed calls counted: {hits}")
            rt.disable_apply()


if __name__ == "__main__":
    main()
