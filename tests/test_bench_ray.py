"""`fibgen bench --ray` on a local Ray cluster: the local runner's traces, faults, resume."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fibgen.bench.ray_runner import RayOptions, run_bench_ray
from fibgen.bench.runner import BenchOptions, run_bench
from fibgen.cli import main
from fibgen.format import Solution, Workload, append_workloads
from fibgen.format.dataset import save_blob, write_solution

from _bench_dataset import DEFINITION, make_dataset, solution
from _shared import require_module

# Slow as a whole: starts a local Ray cluster.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
TRACES = Path("traces") / "scale" / "scale_h64.jsonl"
# A generous timeout: on a loaded machine a fresh solution process can take seconds to start,
# and no test here waits for one to run out.
OPTIONS = BenchOptions(devices=("cpu",), timeout=60, warmup=1, repeat=3)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One local Ray cluster of 2 CPUs for the module; its GCS address."""
    ray = require_module("ray", "Ray is not installed (pip install 'fibgen[ray]')")
    base = tmp_path_factory.mktemp("ray")
    mp = pytest.MonkeyPatch()
    # The cluster's workers inherit these: builds and blobs stay in this test's folder, and
    # the local runner's workers (same FIBGEN_CACHE_DIR) print the same source paths.
    mp.setenv("FIBGEN_CACHE_DIR", str(base / "cache"))
    mp.setenv("FIBGEN_RAY_CACHE", str(base / "node"))
    # Ray leaves its SIGTERM handler after shutdown; the tests after these expect none.
    sigterm = signal.getsignal(signal.SIGTERM)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        signal.signal(signal.SIGTERM, sigterm)
        mp.undo()


def _source_solution(name: str, source: str) -> Solution:
    obj = solution("good_returns").model_dump(mode="json")
    obj["name"] = name
    obj["sources"] = [{"path": "main.py", "content": source}]
    return Solution.model_validate(obj)


def _add(root: Path, *solutions: Solution) -> None:
    for s in solutions:
        write_solution(root, s, DEFINITION["op_type"])


def _lines(root: Path) -> list[dict]:
    path = root / TRACES
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _comparable(trace: dict, root: Path) -> tuple:
    # Everything but what a second run measures anew: timings, the machine, the time; and
    # the dataset's folder, which logs name where they name a solution's files.
    evaluation = dict(trace["evaluation"])
    for key in ("performance", "environment", "timestamp"):
        evaluation.pop(key, None)
    if evaluation["status"] == "PASSED":
        evaluation.pop("log")  # the timings' spread
    else:
        evaluation["log"] = evaluation["log"].replace(str(root), "DATASET")
    return (
        trace["workload"]["uuid"],
        trace["solution"],
        json.dumps(trace["workload"], sort_keys=True),
        json.dumps(evaluation, sort_keys=True),
    )


def _with_blob_workload(root: Path) -> Path:
    """A workload whose input comes from a blob file: it travels to the node."""
    x = torch.arange(5 * 64, dtype=torch.float32).reshape(5, 64) / 100
    path = save_blob(root, "scale", "scale_h64", "fromblob", {"x": x})
    workload = Workload.model_validate(
        {
            "uuid": "fromblob",
            "axes": {"n": 5},
            "inputs": {
                "x": {"type": "safetensors", "path": path, "tensor_key": "x"},
                "w": {"type": "random"},
            },
        }
    )
    append_workloads(root, "scale", "scale_h64", [workload])
    return root


SOLUTIONS = ["good_returns", "good_dps", "wrong_numbers", "raises", "bad_import", "aborts", "hangs"]


def test_traces_equal_the_local_runners(cluster, tmp_path):
    local = _with_blob_workload(make_dataset(tmp_path / "local", SOLUTIONS, sizes=(3,)))
    remote = _with_blob_workload(make_dataset(tmp_path / "ray", SOLUTIONS, sizes=(3,)))
    # `hangs` runs out its time on both runners: 8 s, not the module's 60.
    options = replace(OPTIONS, timeout=8)
    run_bench(local, replace(options, devices=("cpu", "cpu")), progress=False)
    summary = run_bench_ray(remote, options, progress=False)
    assert summary.problems == []
    got, want = _lines(remote), _lines(local)
    assert len(got) == len(want) == 2 * len(SOLUTIONS) == summary.traces
    assert sorted(_comparable(t, remote) for t in got) == sorted(
        _comparable(t, local) for t in want
    )
    statuses = {(t["workload"]["uuid"], t["solution"]): t["evaluation"]["status"] for t in got}
    assert statuses[("n3", "aborts")] == "RUNTIME_ERROR"
    assert statuses[("fromblob", "hangs")] == "TIMEOUT"
    assert statuses[("fromblob", "good_dps")] == "PASSED"
    assert not summary.problems and summary.retried == 0
    ((node, stats),) = summary.nodes.items()
    assert stats.workers == 2 and stats.runs == len(got)


def _kill_when_marked(mark: Path, killed: list[int], done: threading.Event) -> threading.Thread:
    """Kill the process whose pid appears in ``mark``, once, watching until ``done``: on a
    loaded machine the cluster's workers may take minutes to start, so no deadline here."""

    def watch() -> None:
        while not done.is_set():
            if mark.exists() and mark.read_text().strip():
                pid = int(mark.read_text())
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


# The solution runs below the Ray worker (the actor): in a process forked by the fork server of
# the actor's worker process. `_actor()` is the first of its ancestors that Ray titled.
_ACTOR = (
    "def _parent(pid):\n"
    "    with open(f'/proc/{pid}/stat') as f:\n"
    "        return int(f.read().rsplit(')', 1)[1].split()[1])\n\n"
    "def _actor():\n"
    "    pid = os.getppid()\n"
    "    while pid > 1:\n"
    "        with open(f'/proc/{pid}/cmdline', 'rb') as f:\n"
    "            if f.read().startswith(b'ray::'):\n"
    "                return pid\n"
    "        pid = _parent(pid)\n"
    "    raise RuntimeError('no Ray worker above this process')\n\n"
)


def test_lost_workers_are_replaced_and_their_jobs_sent_again_up_to_the_retries(cluster, tmp_path):
    # One run, two faults (a run costs the cluster's worker starts, so they share one):
    # - `names_its_worker` names its Ray worker (the actor) on its first run, on any workload
    #   but n3, and waits; the test kills that worker once, from outside. Its job is sent
    #   again (one retry) and passes.
    # - `kills_its_worker` kills its own worker on workload n3, every time: that job is lost
    #   twice, and with --retries 1 reported as not run after its one retry.
    mark = tmp_path / "worker.pid"
    waits = _source_solution(
        "names_its_worker",
        "import os, time\n\n"
        f"MARK = {str(mark)!r}\n\n" + _ACTOR + "def run(x, w):\n"
        "    if x.shape[0] != 3 and not os.path.exists(MARK):\n"
        "        with open(MARK + '.tmp', 'w') as f:\n"
        "            f.write(str(_actor()))\n"
        "        os.replace(MARK + '.tmp', MARK)\n"
        "        time.sleep(600)\n"
        "    return x * w\n",
    )
    kills = _source_solution(
        "kills_its_worker",
        "import os, signal\n\n" + _ACTOR + "def run(x, w):\n"
        "    if x.shape[0] == 3:\n"
        "        os.kill(_actor(), signal.SIGKILL)\n"
        "    return x * w\n",
    )
    # More workloads than workers: each worker also holds a queued job, which goes back to
    # the queue uncharged when its worker is lost.
    sizes = (3, 17, 4, 5, 6, 7)
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=sizes)
    _add(root, waits, kills)
    names = ("good_returns", waits.name, kills.name)
    killed: list[int] = []
    done = threading.Event()
    watcher = _kill_when_marked(mark, killed, done)
    try:
        summary = run_bench_ray(root, OPTIONS, RayOptions(retries=1), progress=False)
    finally:
        done.set()
        watcher.join(timeout=5)
    assert killed, "the solution never ran"
    traces = _lines(root)
    runs = sorted((t["workload"]["uuid"], t["solution"]) for t in traces)
    assert runs == sorted((f"n{n}", s) for n in sizes if n != 3 for s in names)
    assert {t["evaluation"]["status"] for t in traces} == {"PASSED"}
    (problem,) = summary.problems
    assert problem.startswith("scale_h64 workload n3: its worker was lost 2 time(s) (node ")
    assert problem.endswith("not run: 3 run(s) (--retries 1)")
    # Three workers lost: the one killed from outside once, n3's twice; two jobs sent again.
    assert (summary.lost, summary.retried) == (3, 2)
    assert any("sent 2 job(s) again" in note for note in summary.notes)


def test_resume_after_the_driver_is_killed_runs_the_rest_once(cluster, tmp_path):
    sizes = tuple(range(1, 7))
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=sizes)
    command = [sys.executable, "-m", "fibgen.cli", "bench", str(root), "--ray", cluster]
    command += ["--devices", "cpu", "--warmup", "0", "--repeat", "1", "--quiet"]
    driver = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        # Killed as soon as it has written its first traces, with most jobs still to do. On a
        # machine loaded ten times over its cores the cluster took over three minutes to run a
        # first job: the deadline only stops a driver that hangs.
        deadline = time.monotonic() + 900
        while not _lines(root) and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        driver.send_signal(signal.SIGKILL)
    finally:
        driver.wait()
    first = _lines(root)
    assert 1 <= len(first) < len(sizes), driver.stderr.read()
    summary = run_bench_ray(root, replace(OPTIONS, resume=True), progress=False)
    traces = _lines(root)
    uuids = sorted(t["workload"]["uuid"] for t in traces)
    assert uuids == sorted(f"n{n}" for n in sizes)
    assert summary.skipped == len(first) and summary.traces == len(sizes) - len(first)
    assert {t["evaluation"]["status"] for t in traces} == {"PASSED"}


# Bad input: one line that says what and where, a non-zero exit, traces untouched.


@pytest.fixture
def traced(tmp_path):
    """A dataset with a trace file whose last line is torn: a run that starts repairs it."""
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,))
    path = root / TRACES
    path.parent.mkdir(parents=True)
    path.write_text('{"definition": "scale_h64", "workl')
    return root, path.read_bytes()


def _bench(capsys, root: Path, *args: str) -> tuple[int, list[str]]:
    code = main(["bench", str(root), "--devices", "cpu", "--quiet", *args])
    return code, capsys.readouterr().err.splitlines()


def test_an_unreachable_address(traced, capsys):
    require_module("ray", "Ray is not installed (pip install 'fibgen[ray]')")
    root, before = traced
    code, err = _bench(capsys, root, "--ray", "127.0.0.1:1")
    assert code == 1
    assert err == [
        "error: cannot reach a Ray cluster at 127.0.0.1:1: Connection refused; is `ray start "
        "--head` running there, and is the port open to this machine?"
    ]
    assert (root / TRACES).read_bytes() == before
    code, err = _bench(capsys, root, "--ray", "nowhere")
    assert code == 1 and err[0].startswith("error: --ray 'nowhere' is not an address")


def test_a_cluster_without_gpus_for_cuda(cluster, traced, capsys):
    root, before = traced
    code, err = _bench(capsys, root, "--ray", cluster, "--devices", "cuda")
    assert code == 1
    assert err == [
        f"error: --devices cuda: the Ray cluster at {cluster} has no GPU (2 CPU); use "
        "--devices cpu, or add GPU nodes"
    ]
    assert (root / TRACES).read_bytes() == before


def test_a_node_with_another_python_or_fibgen(cluster, traced, capsys, monkeypatch):
    from fibgen.bench import ray_runner, ray_worker

    root, before = traced
    real = ray_worker.identity()
    monkeypatch.setattr(
        ray_runner, "local_identity", lambda: {**real, "python": "3.99", "fibgen": "9.9"}
    )
    code, err = _bench(capsys, root, "--ray", cluster)
    assert code == 1
    assert err == [
        f"error: node {real['node']} ({real['host']}) runs Python {real['python']} (the driver has "
        f"3.99) and fibgen {real['fibgen']} (the driver has 9.9): install the driver's Python "
        f"and fibgen on every node (Ray cluster at {cluster})"
    ]
    assert (root / TRACES).read_bytes() == before


def test_without_ray_installed_it_says_how_to_install_it(traced, capsys, monkeypatch):
    root, before = traced
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    code, err = _bench(capsys, root, "--ray")
    assert code == 2
    assert err == [
        "error: --ray needs Ray, which is not installed: pip install 'fibgen[ray]' (on the "
        "driver and every node of the cluster)"
    ]
    assert (root / TRACES).read_bytes() == before


def test_devices_on_a_cluster_are_a_kind(traced, capsys):
    root, _ = traced
    code, err = _bench(capsys, root, "--ray", "--devices", "cuda:1")
    assert code == 2 and err[0].startswith("error: --devices cuda:1: with --ray, give cpu or cuda")


def test_nothing_else_imports_ray():
    code = (
        "import sys, fibgen.cli, fibgen.bench.runner, fibgen.bench.ray_runner, "
        "fibgen.bench.ray_worker, fibgen.runtime\n"
        "fibgen.cli.build_parser()\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_the_runs_another_bench_claimed_are_skipped_on_the_cluster_too(cluster, tmp_path):
    from fibgen.bench.claims import Claims

    root = make_dataset(tmp_path / "ds", ["good_returns", "good_dps"], sizes=(3, 5))
    other = Claims(root)  # a bench on the same dataset, running all of workload n3
    other.claim("scale_h64", "n3", [solution("good_returns"), solution("good_dps")])
    try:
        summary = run_bench_ray(root, OPTIONS, progress=False)
    finally:
        other.release()
    assert sorted((t["workload"]["uuid"], t["solution"]) for t in _lines(root)) == [
        ("n5", "good_dps"),
        ("n5", "good_returns"),
    ]
    assert sum(summary.claimed.values()) == 2 and not summary.problems
    assert list((root / ".fibgen" / "bench" / "claims").iterdir()) == []
