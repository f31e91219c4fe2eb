"""The loop on a GPU: trace a decode step, bench a FlashInfer-Bench-style dataset, apply it.

    python benchmarks/flywheel.py [--layers 2] [--batches 1,8,32,128] [--out .flywheel]
        [--stage all|trace|bench|apply|check]

Needs a CUDA GPU and flashinfer-python. The step is ``decode_step.py``'s (Llama-3-8B-shaped
layers: ``flashinfer.norm.rmsnorm`` and ``fused_add_rmsnorm``, the QKV GEMM, paged decode
through ``BatchDecodeWithPagedKVCacheWrapper``, the output GEMM, ``silu_and_mul``, the down
GEMM), with pages of 64 tokens, the catalogue's ``gqa_paged_decode_h32_kv8_d128_ps64``.

1. ``trace``: the step runs at each batch size with ``enable_tracing(..., patch=True)``, its
   wrapper planned while tracing; every traced definition gets a FlashInfer-wrapper baseline
   (``solutions/baseline/<op_type>/<name>/flashinfer_wrapper_<name>.json``, a Python solution
   that calls the FlashInfer API itself, as FlashInfer-Bench's dataset has one for every
   definition), and the shipped Triton solutions are copied in.
2. ``bench``: ``fibgen bench`` on the GPU, then ``fibgen report``.
3. ``apply``: ``enable_apply(dataset)``; the step with apply off (FlashInfer's own functions,
   taken before apply patched them) and on, timed in turn in each of 15 rounds, eagerly and
   as replayed CUDA graphs; the largest logit difference. Target: on / off ≤ 1.00.
4. ``check``: bench's e2e figure against the routed eager figure ``gpu.py`` measures (the
   patched FlashInfer call, in paired rounds with FlashInfer's own), for the shipped
   solutions and the wrapper baselines at 1, 64 and 4,096 rows; and whether selection picked
   the candidate that is fastest routed (FlashInfer's own function included). The two
   figures come from two processes at two times, and a host's speed for launch work is not
   the same from one second to the next (``host_speed.py``; benchmarks/README.md, "Host
   speed"), so each is also put at the other's host speed: bench's figure times the ratio of
   FlashInfer's own call as timed here to its figure in bench's rounds (both timed in the
   same rounds as the routed call they go with). Agreement is judged on that figure.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import warnings
from pathlib import Path
from typing import NamedTuple

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import decode_step as ds  # noqa: E402

PAGE = 64
DECODE = f"gqa_paged_decode_h{ds.HEADS}_kv{ds.KV_HEADS}_d{ds.HEAD_DIM}_ps{PAGE}"
NAMES = {
    "rmsnorm": f"rmsnorm_h{ds.HIDDEN}",
    "fused_add_rmsnorm": f"fused_add_rmsnorm_h{ds.HIDDEN}",
    "silu_and_mul": f"silu_and_mul_h{ds.INTER}_bf16",
    "decode": DECODE,
}
OP_TYPES = {"rmsnorm": "rmsnorm", "fused_add_rmsnorm": "rmsnorm", "silu_and_mul": "activation"}
OP_TYPES["decode"] = "gqa_paged"
SHIPPED = {api: f"triton_{NAMES[api]}" for api in ("rmsnorm", "fused_add_rmsnorm", "silu_and_mul")}
LABELS = {
    "rmsnorm": "flashinfer.norm.rmsnorm",
    "fused_add_rmsnorm": "flashinfer.norm.fused_add_rmsnorm",
    "silu_and_mul": "flashinfer.activation.silu_and_mul",
    "decode": "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run",
}

# What FlashInfer-Bench's baselines do: call the API, through its module, destination-passing.
WRAPPERS = {
    "rmsnorm": (
        "import flashinfer\n\n"
        "def run(hidden_states, weight, output):\n"
        f"    flashinfer.norm.rmsnorm(hidden_states, weight, eps={ds.EPS}, out=output)\n"
    ),
    "fused_add_rmsnorm": (
        "import flashinfer\n\n"
        "def run(hidden_states, residual, weight, output):\n"
        "    h, r = hidden_states.clone(), residual.clone()\n"
        f"    flashinfer.norm.fused_add_rmsnorm(h, r, weight, eps={ds.EPS})\n"
        "    output.copy_(h)\n"
    ),
    "silu_and_mul": (
        "import flashinfer\n\n"
        "def run(x, output):\n"
        "    flashinfer.activation.silu_and_mul(x, out=output)\n"
    ),
    "decode": (
        "import torch\nimport flashinfer\n\n_workspace = {}\n\n"
        "def run(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale,\n"
        "        output, lse):\n"
        "    ws = _workspace.get(q.device)\n"
        "    if ws is None:\n"
        "        ws = _workspace[q.device] = torch.empty(128 << 20, dtype=torch.uint8,\n"
        "                                                device=q.device)\n"
        "    w = flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper(ws, 'NHD')\n"
        f"    w.plan(kv_indptr, kv_indices, kv_last_page_len, {ds.HEADS}, {ds.KV_HEADS},\n"
        f"           {ds.HEAD_DIM}, {PAGE}, sm_scale=float(sm_scale),\n"
        "           q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)\n"
        "    o, s = w.run(q, (k_cache, v_cache), return_lse=True)\n"
        "    output.copy_(o)\n"
        "    lse.copy_(s)\n"
    ),
}


def write_solutions(root: Path, apis) -> None:
    """A FlashInfer-wrapper baseline per definition, and the shipped solution where one is."""
    for api in apis:
        name, op_type = NAMES[api], OP_TYPES[api]
        solution = {
            "name": f"flashinfer_wrapper_{name}",
            "definition": name,
            "author": "baseline",
            "spec": {
                "language": "python",
                "target_hardware": ["NVIDIA_H100", "cuda"],
                "entry_point": "main.py::run",
                "destination_passing_style": True,
            },
            "sources": [{"path": "main.py", "content": WRAPPERS[api]}],
            "description": "Calls the FlashInfer API itself, as FlashInfer-Bench's baselines do.",
        }
        folder = root / "solutions" / "baseline" / op_type / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{solution['name']}.json").write_text(json.dumps(solution, indent=2))
        if api in SHIPPED:
            (found,) = (ROOT / "solutions").rglob(f"{SHIPPED[api]}.json")
            target = root / "solutions" / "fibgen" / op_type / name
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(found, target / found.name)


def trace(root: Path, layers: int, batches: list[int]) -> None:
    from fibgen.runtime.tracing.tracer import disable_tracing, enable_tracing, tracing_stats

    if root.exists():
        shutil.rmtree(root)
    model = ds.Model(layers, max(batches), page=PAGE)
    enable_tracing(root, patch=True, dump="int", dedup="axes")
    try:
        ops = ds.Ops.now()  # patched while tracing
        for batch in batches:
            wrapper = model.wrapper(batch, graph=False)  # planned while tracing
            x = torch.randn(batch, ds.HIDDEN, device="cuda").bfloat16()
            model.step(x, wrapper, ops)
        torch.cuda.synchronize()
    finally:
        disable_tracing()
    print(f"traced: {tracing_stats()}")
    write_solutions(root, NAMES)
    for api, name in NAMES.items():
        path = root / "workloads" / OP_TYPES[api] / f"{name}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        print(f"  {name}: {len(lines)} workload(s)")


def bench(root: Path) -> None:
    from fibgen.bench.runner import BenchOptions, run_bench
    from fibgen.cli import main as cli

    summary = run_bench(root, BenchOptions(devices=("cuda:0",), timeout=600), progress=True)
    print(summary.verdict(root))
    for problem in summary.problems:
        print("problem:", problem)
    cli(["report", str(root), "--format", "md"])


def apply(root: Path, layers: int, batches: list[int]) -> None:
    import fibgen.runtime as rt

    model = ds.Model(layers, max(batches), page=PAGE)
    off = ds.Ops.now()  # FlashInfer's own functions, taken before apply patches them
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rt.enable_apply(root)
    for w in caught:
        print(f"enable_apply: {w.message}")
    print(f"\nstep with {layers} layers, {torch.cuda.get_device_name()}, apply on / off")
    print(
        "| batch | eager off µs | eager on µs | on / off (quartiles) | graph off µs "
        "| graph on µs | on / off (quartiles) | max logit diff |"
    )
    print("|---|---|---|---|---|---|---|---|")
    try:
        on = ds.Ops.now()
        for batch in batches:
            figures = ds.measure(model, batch, off, on)
            eager, graph = ds.paired(figures["eager"]), ds.paired(figures["graph"])
            logits = figures["logits"]
            diff = (logits["on"].float() - logits["off"].float()).abs().max().item()
            print(
                f"| {batch} | {eager.off:.1f} | {eager.on:.1f} | {eager.spread()} "
                f"| {graph.off:.1f} | {graph.on:.1f} | {graph.spread()} | {diff:.4f} |"
            )
        stats = rt.stats()
    finally:
        rt.disable_apply()
    print(f"logit scale: {logits['off'].abs().max().item():.2f}")
    for label, counts in sorted(stats.items()):
        print(f"stats {label}: {({k: v for k, v in counts.items() if v})}")


CHECK_ROWS = (1, 64, 4096)


class Checked(NamedTuple):
    """A definition the check benches: its API, hidden size, dtype and epsilon."""

    api: str
    name: str
    hidden: int
    dtype: torch.dtype
    eps: float


def checked(every: bool) -> list[Checked]:
    """The step's three definitions, or every definition a shipped solution serves."""
    from fibgen.paths import builtin_definition_file

    names = (
        sorted({p.parent.parent.name for p in (ROOT / "solutions").rglob("*.json")})
        if every
        else [NAMES[api] for api in ("rmsnorm", "fused_add_rmsnorm", "silu_and_mul")]
    )
    out = []
    for name in names:
        api = name.split("_h")[0]
        path = builtin_definition_file(name)
        assert path is not None, name
        definition = json.loads(path.read_text())
        eps = re.search(r"^EPS = (\S+)$", definition["reference"], re.M)
        dtype = next(iter(definition["inputs"].values()))["dtype"]
        out.append(
            Checked(
                api,
                name,
                definition["axes"]["hidden_size"]["value"],
                getattr(torch, dtype),
                float(eps.group(1)) if eps else 0.0,
            )
        )
    return out


def check(root: Path, every: bool = False) -> None:
    """Bench's e2e against gpu.py's routed eager figure; selection against the fastest."""
    import fibgen.runtime as rt
    from fibgen.bench.eager import eager_rounds, per_call
    from fibgen.bench.runner import BenchOptions, run_bench
    from fibgen.cli import main as cli
    from fibgen.runtime.selection import best as select
    from fibgen.runtime.selection.entries import LazySolution

    import flashinfer

    if root.exists():
        shutil.rmtree(root)
    cases = checked(every)
    for case in cases:
        axis = "num_tokens" if case.api == "silu_and_mul" else "batch_size"
        rows = ",".join(map(str, CHECK_ROWS))
        assert cli(["workloads", case.name, "--axes", f"{axis}={rows}", "-o", str(root)]) == 0
    write_solutions(root, ("rmsnorm", "fused_add_rmsnorm", "silu_and_mul"))
    for case in cases:
        if case.name not in NAMES.values():  # the step's three have theirs already
            (found,) = (ROOT / "solutions").rglob(f"triton_{case.name}.json")
            target = root / "solutions" / "fibgen" / OP_TYPES[case.api] / case.name
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(found, target / found.name)
    summary = run_bench(root, BenchOptions(devices=("cuda:0",), timeout=600), progress=False)
    print(summary.verdict(root))
    traces = {}
    for path in (root / "traces").rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            t = json.loads(line)
            rows = next(iter(t["workload"]["axes"].values()))
            perf = t["evaluation"].get("performance") or {}
            traces[(t["definition"], rows, t["solution"])] = perf
    table, _ = select.load_table(root)
    own = {
        "rmsnorm": flashinfer.norm.rmsnorm,
        "fused_add_rmsnorm": flashinfer.norm.fused_add_rmsnorm,
        "silu_and_mul": flashinfer.activation.silu_and_mul,
    }
    print(
        "\n| definition | rows | candidate | bench e2e µs (own) | routed µs (own) "
        "| bench at this host speed µs | ratio | within 10% or 1 µs |"
    )
    print("|---|---|---|---|---|---|---|---|")
    misses = raw_misses = 0
    for api, name, hidden, dtype, eps in cases:
        solutions = {
            p.stem: p
            for p in (root / "solutions").rglob("*.json")
            if json.loads(p.read_text())["definition"] == name
        }
        for rows in CHECK_ROWS:
            width = 2 * hidden if api == "silu_and_mul" else hidden
            x = torch.randn(rows, width, device="cuda").to(dtype)
            r = torch.randn(rows, hidden, device="cuda").to(dtype)
            w = torch.randn(hidden, device="cuda").to(dtype)
            calls = {
                "rmsnorm": lambda f: f(x, w, eps),
                "fused_add_rmsnorm": lambda f: f(x, r, w, eps),
                "silu_and_mul": lambda f: f(x),
            }[api]
            routed = {}
            for solution, path in sorted(solutions.items()):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    rt.enable_apply({name: LazySolution(path)})
                try:
                    patched = getattr(
                        flashinfer.activation if api == "silu_and_mul" else flashinfer.norm, api
                    )
                    for _ in range(5):
                        calls(patched)
                    from fibgen.runtime.launch import replay

                    replay.wait_native(strict=True)
                    fns = {"routed": lambda: calls(patched), "own": lambda: calls(own[api])}
                    eager_rounds(fns, rounds=3)
                    costs = eager_rounds(fns, rounds=21)
                finally:
                    rt.disable_apply()
                routed[solution] = statistics.median(per_call(c) for c in costs["routed"])
                mine = statistics.median(per_call(c) for c in costs["own"])
                routed["(FlashInfer's own)"] = mine
                perf = traces.get((name, rows, solution), {})
                e2e, theirs = perf.get("e2e_latency_ms"), perf.get("original_e2e_latency_ms")
                here = f"{routed[solution]:.2f} ({mine:.2f})"
                if e2e is None or not theirs:
                    print(f"| {name} | {rows} | {solution} | - | {here} | - | - | - |")
                    continue
                e2e, theirs = e2e * 1e3, theirs * 1e3
                at_here = e2e * mine / theirs
                ok = abs(at_here - routed[solution]) <= max(0.1 * routed[solution], 1.0)
                raw_ok = abs(e2e - routed[solution]) <= max(0.1 * routed[solution], 1.0)
                misses += not ok
                raw_misses += not raw_ok
                print(
                    f"| {name} | {rows} | {solution} | {e2e:.2f} ({theirs:.2f}) | {here} "
                    f"| {at_here:.2f} | {at_here / routed[solution]:.2f} "
                    f"| {'yes' if ok else 'NO'} |"
                )
            info = table["definitions"].get(name)
            chosen = _choice(info, rows)
            fastest = min(routed, key=routed.get)
            print(
                f"|   selection at {rows} rows | picked {chosen} | fastest routed: {fastest} "
                f"({routed[fastest]:.2f} µs) | | | |"
            )
    print(
        f"\n{misses} bench e2e figure(s) outside 10% (or 1 µs) of the routed eager figure at the"
        f" same host speed ({raw_misses} as measured, at two host speeds)"
    )


def _choice(info, rows: int) -> str:
    from fibgen.runtime.selection import best as select

    if info is None:
        return "(FlashInfer's own: not routed)"
    if "keyed" in info:
        for values, solution in info["keyed"]["keys"]:
            if values[0] == rows:
                return "(FlashInfer's own)" if solution == select.ORIGINAL else solution
    return info["ranking"][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batches", default="1,8,32,128")
    parser.add_argument("--out", default=".flywheel")
    parser.add_argument(
        "--stage", choices=("all", "trace", "bench", "apply", "check"), default="all"
    )
    parser.add_argument(
        "--every-shipped",
        action="store_true",
        help="check: every definition a shipped solution serves, not only the step's three",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: benchmarks/flywheel.py needs a CUDA GPU")
    batches = [int(b) for b in args.batches.split(",")]
    root = Path(args.out) / "dataset"
    if args.stage in ("all", "trace"):
        trace(root, args.layers, batches)
    if args.stage in ("all", "bench"):
        bench(root)
    if args.stage in ("all", "apply"):
        apply(root, args.layers, batches)
    if args.stage in ("all", "check"):
        check(Path(args.out) / "check", args.every_shipped)


if __name__ == "__main__":
    main()
