"""GPU benchmark of the shipped Triton solutions: latency, bandwidth, speedups, timer check.

    python benchmarks/gpu.py [--tune] [--quick] [--tables all|kernel|eager]

For rmsnorm and fused_add_rmsnorm (hidden 4096, bf16) and silu_and_mul (hidden 14336, bf16),
at 1..65536 rows: the solution's latency (fibgen's CUDA-event timer, L2 flushed, median),
its achieved bandwidth as a share of a large device-to-device copy measured in the same run,
and its speedup over the definition's reference and over ``torch.nn.functional.rms_norm``.
Every latency is the median of the calls of three rounds that alternate between the things
compared, so a slow spell of the GPU falls on all of them alike. The norm tables also time
the kernel under do_bench's zeroing flush (Note [flushing L2] in ``fibgen/bench/timing.py``).
The last table compares fibgen's timer with ``triton.testing.do_bench``, both flushing the
same way. The "eager loop, end to end" tables time what an engine's eager loop pays per call
(``fibgen.bench.eager.eager_rounds``: back-to-back calls, no flush, CPU launch included, a
round's fixed start and end taken out, Note [eager rounds]): the call routed by
``enable_apply`` through FlashInfer's patched API to the shipped solution, FlashInfer's own
API, and torch, timed in turn within each of 15 rounds; µs are medians over the rounds, ratios
medians of each round's ratio. Their "round start" columns are that fixed part: what a loop's
first call from an idle device adds, and the sync after its last (noisy below a few thousand
rows, where it is a small difference of two long timings). ``--tune`` first sweeps rows per
program and warps for the norm kernels and prints the best variant per size next to the one the
solution picks.

Needs only torch and triton (no pydantic): solution and definition JSON are read as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import statistics
import sys
import tempfile
import types
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fibgen.bench.timing import cuda_samples, time_cuda  # noqa: E402

ROWS = [1 << i for i in range(17)]  # 1 .. 65536
ROUNDS = 3
EAGER_ROUNDS = 15  # the eager tables: the host's speed swings more than the GPU's
TIMER_ROWS = (1, 16, 64, 1024, 4096, 16384, 65536)
EPS = 1e-5  # the epsilon of rmsnorm_h4096 and fused_add_rmsnorm_h4096


def load_solution(op_type: str, definition: str, name: str) -> types.ModuleType:
    """Import a shipped solution's entry module from its JSON, as its own package."""
    found = sorted((ROOT / "solutions").rglob(f"{name}.json"))
    if not found:
        sys.exit(f"error: no {name}.json under {ROOT / 'solutions'}")
    doc = json.loads(found[0].read_text())
    folder = Path(tempfile.mkdtemp(prefix="fibgen-gpu-"))
    for source in doc["sources"]:
        (folder / source["path"]).write_text(source["content"])
    package = f"_gpu_{name}"
    module = types.ModuleType(package)
    module.__path__ = [str(folder)]
    sys.modules[package] = module
    entry_file, _ = doc["spec"]["entry_point"].split("::")
    entry = importlib.import_module(f"{package}.{entry_file[:-3]}")
    # As fibgen's loader does: the kernels launch without Triton's per-call work.
    from fibgen.runtime.launch.fast import accelerate_modules

    accelerate_modules([m for n, m in sys.modules.items() if n.startswith(package + ".")], package)
    return entry


def load_reference(op_type: str, definition: str):
    """The definition's reference ``run`` (from the built definition JSON)."""
    path = ROOT / "generated" / "definitions" / op_type / f"{definition}.json"
    if not path.is_file():
        sys.exit(f"error: {path} is missing; run `fibgen build definitions/` first")
    namespace: dict = {}
    exec(json.loads(path.read_text())["reference"], namespace)
    return namespace["run"]


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = time_cuda(lambda: dst.copy_(src), warmup=5, repeat=30, flush="none")
    return 2 * nbytes / ms / 1e6


def bench(fn, repeat: int | None, flush: str = "read") -> float:
    """fibgen's timing: median of CUDA-event-timed calls with L2 flushed, milliseconds."""
    return time_cuda(fn, warmup=10, repeat=repeat, flush=flush)


Sampler = Callable[[], list[float]]


def sampler(fn, repeat: int | None, flush: str = "read") -> Sampler:
    """fibgen's timer over ``fn``: one round of single-call times."""
    return lambda: cuda_samples(fn, warmup=10, repeat=repeat, flush=flush)


def pooled(samplers: dict[str, Sampler], rounds: int = ROUNDS) -> dict[str, float]:
    """Median over ``rounds`` alternating rounds of every sampler, pooled per sampler."""
    samples: dict[str, list[float]] = {name: [] for name in samplers}
    for _ in range(rounds):
        for name, take in samplers.items():
            samples[name] += take()
    return {name: statistics.median(values) for name, values in samples.items()}


@contextlib.contextmanager
def do_bench_flushing(flush: str):
    """Make ``triton.testing.do_bench`` flush L2 the way fibgen's ``flush`` does.

    do_bench zeroes its buffer through the active driver's ``clear_cache``; for ``"read"``
    that method is shadowed on the driver object for the duration, then restored.
    """
    from triton.runtime import driver

    active = driver.active
    if flush == "zero":
        yield
        return
    sink = torch.empty((), dtype=torch.int64, device="cuda")
    active.clear_cache = lambda cache: torch.sum(cache, dim=0, dtype=torch.int64, out=sink)
    try:
        yield
    finally:
        del active.clear_cache


def do_bench_sampler(fn, flush: str) -> Sampler:
    """``triton.testing.do_bench`` over ``fn`` (its defaults), one round of its samples."""
    import triton.testing

    def take() -> list[float]:
        with do_bench_flushing(flush):
            return list(triton.testing.do_bench(fn, return_mode="all"))

    return take


def norm_case(kind: str, rows: int, hidden: int):
    """Inputs, output, bytes moved and callables for rmsnorm or fused_add_rmsnorm."""
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x) if kind == "fused_add_rmsnorm" else None
    out = torch.empty_like(x)
    nbytes = x.numel() * 2 * (3 if r is not None else 2) + hidden * 2
    return x, r, w, out, nbytes


def tune(norm_mod, hidden_sizes, rows_list, repeat: int) -> None:
    """Sweep rows per program and warps; print the best variant next to the default pick."""
    launch = norm_mod.launch
    config = norm_mod.config
    print("\n## Tuning (rmsnorm kernel, bf16): best variant vs the default pick\n")
    print("| hidden | rows | residual | default (rows/prog, warps) | default µs | best | best µs |")
    print("|---|---|---|---|---|---|---|")
    for hidden in hidden_sizes:
        for rows in rows_list:
            for kind in ("rmsnorm", "fused_add_rmsnorm"):
                x, r, w, out, _ = norm_case(kind, rows, hidden)
                pick = config(rows, hidden)
                base = bench(lambda: launch(x, r, w, out, EPS), repeat)
                results = {}
                for rpp in (1, 2, 4, 8):
                    if rpp * triton_next_pow2(hidden) > 16384:
                        continue
                    for warps in (2, 4, 8, 16):
                        results[(rpp, warps)] = bench(
                            lambda: launch(x, r, w, out, EPS, rpp, warps), repeat
                        )
                best = min(results, key=results.get)
                print(
                    f"| {hidden} | {rows} | {r is not None} | {pick} | {base * 1e3:.2f} "
                    f"| {best} | {results[best] * 1e3:.2f} |"
                )
                del x, r, w, out


def triton_next_pow2(n: int) -> int:
    """The smallest power of two ≥ n."""
    return 1 << (n - 1).bit_length()


def main() -> None:
    """Print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tune", action="store_true", help="sweep kernel variants first")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke test)")
    parser.add_argument(
        "--tables",
        choices=("all", "kernel", "eager"),
        default="all",
        help="kernel: GPU time behind an L2 flush; eager: end to end in an eager loop",
    )
    args = parser.parse_args()
    # None: as many calls as fit in 100 ms, as do_bench does.
    repeat = 20 if args.quick else None
    rounds = 1 if args.quick else ROUNDS
    torch.manual_seed(0)

    import triton

    print(
        f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"triton {triton.__version__}"
    )
    if args.tables == "eager":
        eager_tables(ROWS)
        return
    copy_gbs = copy_bandwidth()
    print(f"device-to-device copy (1 GiB, read + write): {copy_gbs:.0f} GB/s")

    rms = load_solution("rmsnorm", "rmsnorm_h4096", "triton_rmsnorm_h4096")
    fadd = load_solution("rmsnorm", "fused_add_rmsnorm_h4096", "triton_fused_add_rmsnorm_h4096")
    silu = load_solution(
        "activation", "silu_and_mul_h14336_bf16", "triton_silu_and_mul_h14336_bf16"
    )
    norm_mod = sys.modules[rms.__name__.rsplit(".", 1)[0] + ".rmsnorm_triton"]
    if args.tune:
        tune(norm_mod, (128, 512, 2048, 4096, 7168), (1, 256, 4096, 16384, 65536), 30)

    timer_cases = []
    for kind, hidden, module in (
        ("rmsnorm", 4096, rms),
        ("fused_add_rmsnorm", 4096, fadd),
    ):
        reference = load_reference("rmsnorm", f"{kind}_h{hidden}")
        print(f"\n## {kind}, hidden {hidden}, bf16\n")
        print(
            "| rows | µs | GB/s | % of copy | same-size copy µs | % of same-size copy "
            "| µs, zeroing flush | % of copy, zeroing flush | reference µs "
            "| speedup vs reference | torch µs | speedup vs torch | max abs err |"
        )
        print("|" + "---|" * 13)
        for rows in ROWS:
            x, r, w, out, nbytes = norm_case(kind, rows, hidden)
            if r is None:
                call = lambda: module.run(x, w, out)  # noqa: E731
                ref = lambda: reference(x, w)  # noqa: E731
                # torch's fused kernel on the same input.
                torch_fn = lambda: F.rms_norm(x, (hidden,), w, EPS)  # noqa: E731
            else:
                call = lambda: module.run(x, r, w, out)  # noqa: E731
                ref = lambda: reference(x, r, w)  # noqa: E731
                # The fair torch baseline for the fused kernel adds, then normalizes.
                torch_fn = lambda: F.rms_norm(x + r, (hidden,), w, EPS)  # noqa: E731
            # A copy of as many bytes as the kernel moves: the ceiling under the same flush.
            src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)
            out.fill_(float("nan"))
            call()
            err = (out.float() - ref().float()).abs().max().item()
            times = pooled(
                {
                    "fibgen": sampler(call, repeat),
                    "zero": sampler(call, repeat, flush="zero"),
                    "reference": sampler(ref, repeat),
                    "torch": sampler(torch_fn, repeat),
                    "copy": sampler(lambda: dst.copy_(src), repeat),
                },
                rounds,
            )
            del src, dst
            t = times["fibgen"]
            gbs = nbytes / t / 1e6
            gbs_zero = nbytes / times["zero"] / 1e6
            print(
                f"| {rows} | {t * 1e3:.2f} | {gbs:.0f} | {100 * gbs / copy_gbs:.1f}% "
                f"| {times['copy'] * 1e3:.2f} | {100 * times['copy'] / t:.1f}% "
                f"| {times['zero'] * 1e3:.2f} | {100 * gbs_zero / copy_gbs:.1f}% "
                f"| {times['reference'] * 1e3:.2f} | {times['reference'] / t:.2f}× "
                f"| {times['torch'] * 1e3:.2f} | {times['torch'] / t:.2f}× | {err:.3g} |"
            )
            if rows in TIMER_ROWS:
                timer_cases.append((kind, rows, timer_check(call, repeat, rounds)))
            del x, r, w, out

    reference = load_reference("activation", "silu_and_mul_h14336_bf16")
    print("\n## silu_and_mul, hidden 14336, bf16\n")
    print(
        "| rows | fibgen µs | GB/s | % of copy | reference µs | speedup vs reference | max abs err |"
    )
    print("|---|---|---|---|---|---|---|")
    for rows in ROWS:
        if rows > 16384:
            break
        x = torch.randn(rows, 2 * 14336, device="cuda", dtype=torch.bfloat16)
        out = torch.full((rows, 14336), float("nan"), device="cuda", dtype=torch.bfloat16)
        call = lambda: silu.run(x, out)  # noqa: E731
        ref = lambda: reference(x)  # noqa: E731
        call()
        err = (out.float() - ref().float()).abs().max().item()
        times = pooled({"fibgen": sampler(call, repeat), "reference": sampler(ref, repeat)}, rounds)
        t = times["fibgen"]
        gbs = (x.numel() + out.numel()) * 2 / t / 1e6
        print(
            f"| {rows} | {t * 1e3:.2f} | {gbs:.0f} | {100 * gbs / copy_gbs:.1f}% "
            f"| {times['reference'] * 1e3:.2f} | {times['reference'] / t:.2f}× | {err:.3g} |"
        )
        if rows in (1, 1024, 16384):
            timer_cases.append(("silu_and_mul", rows, timer_check(call, repeat, rounds)))
        del x, out

    print("\n## fibgen's timer vs triton.testing.do_bench, flushing L2 the same way\n")
    print(
        "| kernel | rows | fibgen µs | do_bench µs (reading flush) | difference "
        "| fibgen µs, zeroing flush | do_bench µs (its own zeroing flush) | difference "
        "| do_bench's own spread over rounds, zeroing |"
    )
    print("|" + "---|" * 9)
    for kind, rows, c in timer_cases:
        print(
            f"| {kind} | {rows} | {c['read'] * 1e3:.2f} | {c['db_read'] * 1e3:.2f} "
            f"| {100 * (c['read'] - c['db_read']) / c['db_read']:+.1f}% "
            f"| {c['zero'] * 1e3:.2f} | {c['db_zero'] * 1e3:.2f} "
            f"| {100 * (c['zero'] - c['db_zero']) / c['db_zero']:+.1f}% "
            f"| {100 * c['db_zero_spread']:.1f}% |"
        )
    if args.tables == "all":
        eager_tables(ROWS)


def eager_tables(rows_list: list[int]) -> None:
    """Routed solution vs FlashInfer's own API vs torch, µs per call in an eager loop."""
    import warnings

    import fibgen.runtime as rt

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _shipped import routes

    try:
        import flashinfer
    except Exception as exc:  # noqa: BLE001
        sys.exit(f"error: the eager tables compare with FlashInfer, which does not import: {exc}")
    from fibgen.bench.eager import eager_rounds

    hidden, inter = 4096, 14336
    table = routes(hidden, inter)

    def norm(x, r, w):
        return flashinfer.norm.rmsnorm(x, w, EPS)

    def fused(x, r, w):
        flashinfer.norm.fused_add_rmsnorm(x, r, w, EPS)

    def silu(x, r, w):
        return flashinfer.activation.silu_and_mul(x)

    def torch_norm(x, r, w):
        return F.rms_norm(x, (hidden,), w, EPS)

    def torch_fused(x, r, w):
        r.add_(x)
        return F.rms_norm(r, (hidden,), w, EPS)

    def torch_silu(x, r, w):
        return F.silu(x[:, :inter]) * x[:, inter:]

    ops = (
        ("rmsnorm", hidden, norm, torch_norm, "flashinfer.norm.rmsnorm"),
        ("fused_add_rmsnorm", hidden, fused, torch_fused, "flashinfer.norm.fused_add_rmsnorm"),
        ("silu_and_mul", 2 * inter, silu, torch_silu, "flashinfer.activation.silu_and_mul"),
    )
    # Each table routes its own definition only (the others would never match a call).
    definitions = {
        "rmsnorm": f"rmsnorm_h{hidden}",
        "fused_add_rmsnorm": f"fused_add_rmsnorm_h{hidden}",
        "silu_and_mul": f"silu_and_mul_h{inter}_bf16",
    }
    from fibgen.runtime.launch import replay

    for name, width, api, torch_fn, api_name in ops:
        print(f"\n## {name}, eager loop, end to end (µs per call, bf16, hidden {width})\n")
        print(
            "| rows | routed µs | FlashInfer µs | torch µs | routed / FlashInfer "
            "| routed / torch | round start µs, routed | round start µs, FlashInfer "
            "| routed calls |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for rows in rows_list:
            x = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
            r = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
            # FlashInfer's own function, taken before enabling patches its path; `api` looks
            # the path up at each call, so it is routed once enabled.
            own_fn = _call_of(api_name)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                rt.enable_apply({definitions[name]: table[definitions[name]]})
            try:
                for _ in range(5):
                    api(x, r, w)
                replay.wait_native(strict=True)  # timed as a settled process runs
                calls = {"own": own_fn, "torch": torch_fn, "routed": api}
                fns = {k: (lambda fn=fn: fn(x, r, w)) for k, fn in calls.items()}
                if rows == rows_list[0]:
                    # A fresh process runs its first timings slower (measured: 1.5x for one
                    # candidate at 1 row): one untimed pass over the candidates first.
                    eager_rounds(fns, rounds=3)
                # Each round times the three within milliseconds: ratios are paired per round.
                costs = eager_rounds(fns, rounds=EAGER_ROUNDS)
                hits = rt.stats()[api_name]["hit"]
            finally:
                rt.disable_apply()
            if not hits:
                sys.exit(f"error: {api_name} was not routed at {rows} rows: {rt.stats()}")

            def median(key, field="per_call"):
                return statistics.median(getattr(c, field) for c in costs[key])

            def ratio(key):
                pairs = zip(costs["routed"], costs[key])
                return statistics.median(a.per_call / b.per_call for a, b in pairs)

            print(
                f"| {rows} | {median('routed'):.1f} | {median('own'):.1f} "
                f"| {median('torch'):.1f} | {ratio('own'):.2f} | {ratio('torch'):.2f} "
                f"| {median('routed', 'fixed'):.0f} | {median('own', 'fixed'):.0f} | {hits} |"
            )
            del x, r, w


def _call_of(api_name: str):
    """The function now at ``api_name``, as a call of ``(x, r, w)``."""
    module, _, attr = api_name.rpartition(".")
    fn = getattr(importlib.import_module(module), attr)
    if attr == "rmsnorm":
        return lambda x, r, w: fn(x, w, EPS)
    if attr == "fused_add_rmsnorm":
        return lambda x, r, w: fn(x, r, w, EPS)
    return lambda x, r, w: fn(x)


def timer_check(call, repeat: int | None, rounds: int) -> dict[str, float]:
    """fibgen's timer and do_bench on ``call`` under both flushes, in alternating rounds."""
    # do_bench's spread: the medians of its rounds, largest over smallest.
    medians: list[float] = []
    db_zero = do_bench_sampler(call, "zero")

    def db_zero_round() -> list[float]:
        samples = db_zero()
        medians.append(statistics.median(samples))
        return samples

    times = pooled(
        {
            "read": sampler(call, repeat),
            "db_read": do_bench_sampler(call, "read"),
            "zero": sampler(call, repeat, flush="zero"),
            "db_zero": db_zero_round,
        },
        rounds,
    )
    times["db_zero_spread"] = max(medians) / min(medians) - 1
    return times


if __name__ == "__main__":
    main()
