"""`fibgen bench --ray` against the local runner, and a model of a large cluster.

    python benchmarks/distributed.py throughput [--jobs 240] [--workers 1,2,4]
    python benchmarks/distributed.py appends
    python benchmarks/distributed.py gpu-dataset OUT [--per-definition 8]
    python benchmarks/distributed.py model [TRACED_OUT] [--gpus 64] [--solutions 10]
        [--prepare-s 0.5] [--run-s 0.5] [--driver-ms 4.1]

throughput: short CPU jobs (one workload of a small definition, one solution, --warmup 0
--repeat 1) run by the local runner with W worker processes and by the Ray runner with W
workers on a local Ray cluster of max(W) CPUs started once beforehand. Jobs per second are
over the whole run (worker start included) for both; the Ray runner's cost per job is the
time from sending a job to having recorded its traces, less the time the node spent on it.

appends: what the driver pays to append one job's traces to a trace file as it grows.

gpu-dataset: the definitions of the shared flashinfer-trace dataset that have workloads,
up to K workloads each (inputs read from blobs are made from the generation hints instead,
since the dataset here has no blobs), and two python solutions per definition (the
scaffold, which computes the reference). Bench it on a GPU with the local runner; the
traces' timestamps then give each run's time: the first run of a workload includes
preparing it (inputs, the reference and its timing), the second is a solution alone.

model: those per-run times (means, per op_type; where none were measured, the given
--prepare-s and --run-s) applied to the whole flashinfer-trace dataset (every workload, S
solutions per definition) on G GPUs: GPU-hours, wall time, and what the driver records.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
SHARED = REPO.parent / "shared" / "flashinfer-trace"


def _dataset(root: Path, jobs: int) -> Path:
    from _bench_dataset import make_dataset

    return make_dataset(root, ["good_returns"], sizes=tuple(range(1, jobs + 1)))


def throughput(args: argparse.Namespace) -> None:
    import ray

    from fibgen.bench.ray_runner import RayOptions, run_bench_ray
    from fibgen.bench.runner import BenchOptions, run_bench

    counts = [int(w) for w in args.workers.split(",")]
    options = BenchOptions(devices=("cpu",), warmup=0, repeat=1, timeout=60)
    tmp = Path(tempfile.mkdtemp(prefix="fibgen-distributed-"))
    started = time.perf_counter()
    ray.init(num_cpus=max(counts), include_dashboard=False, log_to_driver=False)
    ray_start = time.perf_counter() - started
    print(
        f"{args.jobs} jobs of 1 run each; local Ray cluster of {max(counts)} CPUs started in "
        f"{ray_start:.1f} s (not counted below)\n"
    )
    print(
        "| workers | local s | local jobs/s | Ray s | Ray jobs/s | Ray until first worker s | "
        "Ray overhead per job ms | driver busy per job ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    try:
        for count in counts:
            local = _dataset(tmp / f"local{count}", args.jobs)
            t = time.perf_counter()
            summary = run_bench(local, replace(options, devices=("cpu",) * count), progress=False)
            local_s = time.perf_counter() - t
            assert summary.traces == args.jobs and not summary.problems, summary.problems
            remote = _dataset(tmp / f"ray{count}", args.jobs)
            t = time.perf_counter()
            summary = run_bench_ray(remote, options, RayOptions(workers=count), progress=False)
            ray_s = time.perf_counter() - t
            assert summary.traces == args.jobs and not summary.problems, summary.problems
            # Worker time per job not spent on the job (sending, replies, idling between
            # jobs), once the first worker was ready; and the driver's own time per job.
            working = (ray_s - summary.startup_s) * count
            overhead = (working - sum(summary.job_s)) / args.jobs
            print(
                f"| {count} | {local_s:.1f} | {args.jobs / local_s:.1f} | {ray_s:.1f} | "
                f"{args.jobs / ray_s:.1f} | {summary.startup_s:.1f} | {overhead * 1e3:.1f} | "
                f"{summary.driver_s / args.jobs * 1e3:.1f} |",
                flush=True,
            )
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def appends(args: argparse.Namespace) -> None:
    """The driver's cost of appending one job's traces to a trace file of N lines."""
    from fibgen.bench.runner import BenchOptions, run_bench
    from fibgen.format import Trace, append_traces

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run_bench(_dataset(root / "one", 1), BenchOptions(warmup=0, repeat=1), progress=False)
        line = next((root / "one" / "traces").rglob("*.jsonl")).read_text().splitlines()[0]
        trace = Trace.model_validate_json(line)
        print(f"one trace line: {len(line)} bytes\n")
        print("| lines in the file | append 1 trace ms | append 10 traces ms |")
        print("|---|---|---|")
        path = root / "traces" / "scale" / "scale_h64.jsonl"
        path.parent.mkdir(parents=True)
        for lines in (0, 1000, 10000, 50000):
            figures = []
            for batch in (1, 10):
                path.write_text((line + "\n") * lines)
                t = time.perf_counter()
                for _ in range(5):
                    append_traces(root, "scale", [trace] * batch)
                figures.append((time.perf_counter() - t) / 5 * 1e3)
            print(f"| {lines} | {figures[0]:.2f} | {figures[1]:.2f} |")


def gpu_dataset(args: argparse.Namespace) -> None:
    from fibgen.format import Workload, write_definition, write_workloads
    from fibgen.format.dataset import load_definition_files
    from fibgen.curation.workloads import load_workloads

    out = Path(args.out)
    definitions = {n: d for n, (_, d) in load_definition_files(SHARED).items()}
    workloads = load_workloads(SHARED)
    names = sorted(n for n in definitions if workloads.get(n))
    for name in names:
        definition = definitions[name]
        write_definition(out, definition)
        chosen = workloads[name][:: max(1, len(workloads[name]) // args.per_definition)]
        rewritten = []
        for workload in chosen[: args.per_definition]:
            obj = workload.model_dump(mode="json")
            obj["inputs"] = {
                k: ({"type": "random"} if v["type"] == "safetensors" else v)
                for k, v in obj["inputs"].items()
            }
            rewritten.append(Workload.model_validate(obj))
        write_workloads(out, definition.op_type, name, rewritten)
        for author in ("a", "b"):
            from fibgen.cli import main

            code = main(
                [
                    "scaffold-solution",
                    name,
                    "--language",
                    "python",
                    "--author",
                    author,
                    "--name",
                    f"{author}_{name}",
                    "-o",
                    str(out / "solutions"),
                ]
            )
            assert code == 0, name
    print(f"{len(names)} definitions with workloads written to {out}")


def _runs(traced: Path) -> dict[str, dict[str, list[float]]]:
    """Per op_type: seconds of the first run of a workload (preparing it included) and of
    the runs after it, from consecutive trace timestamps of one worker."""
    records = []
    for path in sorted((traced / "traces").rglob("*.jsonl")):
        for line in path.read_text().splitlines():
            t = json.loads(line)
            stamp = datetime.fromisoformat(t["evaluation"]["timestamp"]).timestamp()
            records.append((stamp, t["definition"], t["workload"]["uuid"], path.parent.name))
    records.sort()
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"first": [], "next": []})
    for i in range(1, len(records)):
        t0, d0, u0, _ = records[i - 1]
        t1, d1, u1, op_type = records[i]
        kind = "next" if (d0, u0) == (d1, u1) else "first"
        out[op_type][kind].append(t1 - t0)
    return out


def model(args: argparse.Namespace) -> None:
    from fibgen.format.dataset import load_definition_files
    from fibgen.curation.workloads import load_workloads

    definitions = {n: d for n, (_, d) in load_definition_files(SHARED).items()}
    workloads = load_workloads(SHARED)
    by_op: dict[str, int] = defaultdict(int)
    for name, items in workloads.items():
        if name in definitions:
            by_op[definitions[name].op_type] += len(items)
    runs = _runs(Path(args.traced)) if args.traced else {}
    print(
        "| op_type | workloads (jobs) | prepare + first run s, mean (median) | further run s, "
        "mean (median) | source |"
    )
    print("|---|---|---|---|---|")
    total_s = longest = 0.0
    jobs = sum(by_op.values())
    for op_type, count in sorted(by_op.items()):
        got = runs.get(op_type)
        if got and got["first"] and got["next"]:
            first, further = statistics.mean(got["first"]), statistics.mean(got["next"])
            shown = (
                f"{first:.2f} ({statistics.median(got['first']):.2f}) | {further:.2f} "
                f"({statistics.median(got['next']):.2f}) | measured"
            )
            slowest = max(got["first"]) + (args.solutions - 1) * max(got["next"])
        else:
            first, further = args.prepare_s + args.run_s, args.run_s
            shown = f"{first:.2f} | {further:.2f} | assumed"
            slowest = first + (args.solutions - 1) * further
        # A job (one workload, S solutions) prepares the workload once, then runs S times.
        total_s += count * (first + (args.solutions - 1) * further)
        longest = max(longest, slowest)
        print(f"| {op_type} | {count} | {shown} |")
    runs_total = jobs * args.solutions
    wall = max(total_s / args.gpus, longest)
    print(
        f"\n{len(definitions)} definitions, {len([n for n in workloads if n in definitions])} "
        f"with workloads: {jobs} jobs, {runs_total} runs at {args.solutions} solutions per "
        f"definition; {total_s / 3600:.2f} GPU-hours; on {args.gpus} GPUs about "
        f"{wall / 60:.1f} min (the longest job: {longest:.0f} s); the driver records "
        f"{runs_total / wall:.0f} traces/s in {jobs / wall:.1f} jobs/s, busy "
        f"{jobs / wall * args.driver_ms / 10:.1f}% of the time at {args.driver_ms} ms per job"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("throughput")
    p.add_argument("--jobs", type=int, default=240)
    p.add_argument("--workers", default="1,2,4")
    p.set_defaults(func=throughput)
    p = sub.add_parser("appends")
    p.set_defaults(func=appends)
    p = sub.add_parser("gpu-dataset")
    p.add_argument("out")
    p.add_argument("--per-definition", type=int, default=8)
    p.set_defaults(func=gpu_dataset)
    p = sub.add_parser("model")
    p.add_argument("traced", nargs="?", help="a gpu-dataset after `fibgen bench` on a GPU")
    p.add_argument("--gpus", type=int, default=64)
    p.add_argument("--solutions", type=int, default=10)
    p.add_argument("--prepare-s", type=float, default=0.5, help="where not measured")
    p.add_argument("--run-s", type=float, default=0.5, help="where not measured")
    p.add_argument("--driver-ms", type=float, default=4.1, help="the driver's time per job")
    p.set_defaults(func=model)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
