"""Bench's worker processes (and the processes they run solutions in) and multiprocessing's
resource tracker die with the runner, however it dies (issue 14, item 19; Note [worker lifetime] in fibgen/bench/child.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import _bench_dataset
from _bench_dataset import make_dataset

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent

# Slow as a whole: starts and kills benches and waits for their processes.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc"),
]


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name; None when there is no such pid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def _alive(pid: int) -> bool:
    # A zombie has ended: only its parent's wait is missing (PID 1 of a container may not reap).
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _children(pid: int) -> dict[int, str]:
    """Live processes whose parent is ``pid``, with their command lines."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and int(fields[1]) == pid and fields[0] != "Z":
                try:
                    cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                except OSError:
                    continue
                out[int(entry)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return out


def _descendants(pid: int) -> dict[int, str]:
    """Every live process below ``pid``, each named for what it is in bench's tree."""
    out = {}
    for child, cmdline in _children(pid).items():
        if "resource_tracker" in cmdline:
            out[child] = "tracker"
        elif "multiprocessing.spawn" in cmdline:
            out[child] = "worker"
        elif "multiprocessing.forkserver" in cmdline:
            # The server's children are forked from it: the same command line.
            out[child] = "solution" if "forkserver" in _cmdline(pid) else "fork server"
        else:
            out[child] = cmdline
        out.update(_descendants(child))
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


# The timeouts are long: a loaded two-core machine (the whole suite in four workers) may take
# a minute to start or end processes that import torch; a test that passes waits no longer
# than its processes take.
def _wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
def test_workers_and_the_resource_tracker_die_with_the_runner(tmp_path, monkeypatch, sig):
    started = tmp_path / "started"
    # A solution busy in a loop: its worker is not waiting on the pipe, where an end of file
    # would stop it anyway.
    monkeypatch.setitem(
        _bench_dataset.SOLUTIONS,
        "busy",
        (
            f"import pathlib, time\n\ndef run(x, w):\n    pathlib.Path({str(started)!r}).touch()\n"
            "    while True:\n        time.sleep(0.1)\n",
            False,
        ),
    )
    root = make_dataset(tmp_path / "ds", ["busy"], sizes=(3,))
    env = dict(
        os.environ,
        FIBGEN_CACHE_DIR=str(tmp_path / "cache"),
        PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS)]),
    )
    runner = subprocess.Popen(
        [sys.executable, "-m", "fibgen.cli", "bench", str(root), "--devices", "cpu", "--quiet"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    children: dict[int, str] = {}
    try:
        assert _wait_for(started.exists, 120), "the solution never started"
        # The worker runs the solution in a process forked by its fork server (Note
        # [isolated solutions] in fibgen/bench/isolation.py): all four must end.
        children = _descendants(runner.pid)
        kinds = sorted(children.values())
        assert kinds == ["fork server", "solution", "tracker", "worker"], children
        runner.send_signal(sig)
        assert runner.wait(timeout=180) == -sig
        survivors = lambda: [pid for pid in children if _alive(pid)]  # noqa: E731
        assert _wait_for(lambda: not survivors(), 30.0), {p: children[p] for p in survivors()}
    finally:
        # Whatever the outcome, nothing of this test is left running.
        runner.kill()
        for pid in [*children, *_descendants(runner.pid)]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


_WATCHED = """
import ctypes, sys, time

from fibgen.bench.lifetime import die_with_parent

def no_prctl(*args, **kwargs):
    raise OSError("no prctl on this system")

ctypes.CDLL = no_prctl  # as where prctl does not exist: the watchdog alone must hold
die_with_parent(int(sys.argv[1]))
print("watching", flush=True)
time.sleep(60)
"""

_MIDDLE = """
import subprocess, sys, os, time

child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid())],
                         stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "watching"
print(child.pid, flush=True)
time.sleep(60)
"""


def test_without_prctl_the_watchdog_ends_an_orphaned_worker():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    middle = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_MIDDLE), textwrap.dedent(_WATCHED)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    watched = None
    try:
        watched = int(middle.stdout.readline())
        assert _alive(watched)
        middle.kill()
        middle.wait(timeout=30)
        assert _wait_for(lambda: not _alive(watched), 30.0)
    finally:
        middle.kill()
        if watched is not None and _alive(watched):
            os.kill(watched, signal.SIGKILL)


def test_a_worker_whose_runner_is_gone_before_it_starts_exits_at_once():
    # The runner may die while the worker imports torch, before it could ask for a signal.
    code = "from fibgen.bench.lifetime import die_with_parent; die_with_parent(1); print('ran on')"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        timeout=120,
    )
    assert (result.returncode, result.stdout) == (1, "")


def test_ctrl_c_stops_cleanly_says_what_was_written_and_exits_130(tmp_path, monkeypatch):
    # Note [stopping bench]: the first workload is traced, the second hangs; a Ctrl-C then
    # reaches the runner twice (as `timeout -s INT` sends it: to the runner and its group).
    started = tmp_path / "started"
    monkeypatch.setitem(
        _bench_dataset.SOLUTIONS,
        "waits_on_17",
        (
            f"import pathlib, time\n\ndef run(x, w):\n    if x.shape[0] == 17:\n"
            f"        pathlib.Path({str(started)!r}).touch()\n        while True:\n"
            "            time.sleep(0.1)\n    return x * w\n",
            False,
        ),
    )
    root = make_dataset(tmp_path / "ds", ["good_returns", "waits_on_17"], sizes=(3, 17))
    env = dict(
        os.environ,
        FIBGEN_CACHE_DIR=str(tmp_path / "cache"),
        PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS)]),
    )
    runner = subprocess.Popen(
        [sys.executable, "-m", "fibgen.cli", "bench", str(root), "--devices", "cpu"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    tree: dict[int, str] = {}
    try:
        assert _wait_for(started.exists, 240), "the second workload never started"
        tree = _descendants(runner.pid)
        runner.send_signal(signal.SIGINT)
        os.killpg(runner.pid, signal.SIGINT)
        out, err = runner.communicate(timeout=180)
        assert runner.returncode == 130, err
        assert "Traceback" not in err and "Exception ignored" not in err, err
        trace_file = root / "traces" / "scale" / "scale_h64.jsonl"
        assert out.splitlines() == [
            "2 traces written (PASSED 2); 0 already traced, skipped",
            f"  {trace_file}",
            "bench: interrupted: 2 trace(s) written, the workloads in progress dropped; "
            f"`fibgen bench {root} --resume` runs the rest",
        ]
        lines = trace_file.read_text().splitlines()
        assert {json.loads(line)["workload"]["uuid"] for line in lines} == {"n3"}
        survivors = lambda: [pid for pid in tree if _alive(pid)]  # noqa: E731
        assert _wait_for(lambda: not survivors(), 30.0), {p: tree[p] for p in survivors()}
        assert list((root / ".fibgen" / "bench" / "claims").iterdir()) == []
    finally:
        runner.kill()
        for pid in [*tree, *_descendants(runner.pid)]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _imports_torch(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def _ignores_sigint(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    return False


def test_ctrl_c_while_the_workers_import_torch_stops_without_a_traceback(tmp_path):
    # Note [stopping bench]: the group's SIGINT comes while the worker's fork server is
    # loading torch, before multiprocessing would have set it to ignore SIGINT.
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,))
    env = dict(
        os.environ,
        FIBGEN_CACHE_DIR=str(tmp_path / "cache"),
        PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS)]),
    )
    runner = subprocess.Popen(
        [sys.executable, "-m", "fibgen.cli", "bench", str(root), "--devices", "cpu"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    tree: dict[int, str] = {}

    ignoring: dict[str, bool] = {}

    def server_loading_torch() -> bool:
        tree.update(_descendants(runner.pid))
        for pid, kind in tree.items():
            if kind == "fork server" and _imports_torch(pid) and _alive(pid):
                # Whether each process ignores SIGINT now, while it loads torch: the
                # KeyboardInterrupt it would raise otherwise races with its being killed.
                ignoring.update({k: _ignores_sigint(p) for p, k in tree.items()})
                return True
        return False

    try:
        assert _wait_for(server_loading_torch, 240), f"no fork server loading torch: {tree}"
        assert ignoring == {"tracker": True, "worker": True, "fork server": True}
        runner.send_signal(signal.SIGINT)
        os.killpg(runner.pid, signal.SIGINT)
        out, err = runner.communicate(timeout=180)
        assert runner.returncode == 130, err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        assert "Exception ignored" not in err, err
        assert out.splitlines()[-1] == (
            "bench: interrupted: 0 trace(s) written, the workloads in progress dropped; "
            f"`fibgen bench {root} --resume` runs the rest"
        )
        survivors = lambda: [pid for pid in tree if _alive(pid)]  # noqa: E731
        assert _wait_for(lambda: not survivors(), 30.0), {p: tree[p] for p in survivors()}
    finally:
        runner.kill()
        for pid in [*tree, *_descendants(runner.pid)]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
