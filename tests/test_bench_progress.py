"""What bench says while it works, and how two benches on one dataset share it: a first line
before any job, a line when a build starts, runs another bench claimed skipped and said
(Note [bench claims] in fibgen/bench/claims.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from _bench_dataset import make_dataset, solution

from fibgen.bench import messages, runner
from fibgen.bench.claims import Claims
from fibgen.bench.planning import BenchOptions, plan
from fibgen.cli import main
from fibgen.format import Solution


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))


def test_the_first_line_comes_before_the_first_job(tmp_path, capsys, monkeypatch):
    root = make_dataset(tmp_path / "ds", ["good_returns", "good_dps"], sizes=(3, 5))
    seen: list[str] = []

    def first_job(*args, **kwargs):
        # What stderr held when the first job began: the line must be there already.
        seen.append(capsys.readouterr().err)
        raise RuntimeError("stop here")

    monkeypatch.setattr(runner, "run_group", first_job)
    main(["bench", str(root), "--devices", "cpu"])
    assert seen == ["bench: definitions 0/1, workloads 0/2, runs 0/4, ETA ? (starting)\n"]


def _cpp(name: str) -> Solution:
    data = solution("good_returns").model_dump(mode="json")
    data["name"] = name
    data["spec"]["language"] = "cpp"
    data["spec"]["entry_point"] = "main.cpp::run"
    data["sources"] = [{"path": "main.cpp", "content": "// built by no one\n"}]
    return Solution.model_validate(data)


class _Answers:
    """A worker handle that answers every question at once: nothing is built or run."""

    process = object()

    def __init__(self) -> None:
        self.asked: list[str] = []

    def ask(self, request: messages.Prepare | messages.Evaluate, timeout: float) -> messages.Reply:
        if isinstance(request, messages.Prepare):
            times = {"median_ms": 1.0, "q1_ms": 1.0, "q3_ms": 1.0, "samples": 3}
            return messages.Prepared({**times, "calls_per_sample": 1}, "cpu", {})
        self.asked.append(request.run.solution["name"])
        return messages.Result({"status": "RUNTIME_ERROR", "log": "not run"})


def test_a_line_says_when_a_build_starts_and_none_when_it_is_cached(tmp_path, monkeypatch):
    from fibgen.runtime.solutions import builders

    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,))
    group = plan(root, BenchOptions()).groups[0]
    group = replace(group, solutions=(*group.solutions, _cpp("cpp_one")))
    handle, notes = _Answers(), []

    def note(text: str) -> None:
        notes.append((text, list(handle.asked)))

    runner.run_group(handle, group, root, BenchOptions(), note)
    # Said before the solution was asked for, and only of the one that is built.
    assert notes == [
        (
            "bench: building cpp_one (cpp) for its first run; a build takes a minute or so",
            ["good_returns"],
        )
    ]
    # Once its build is in the cache, loading it builds nothing, and nothing is said.
    assert not builders.is_built(group.solutions[1])
    folder = builders.build_root() / builders.solution_digest(group.solutions[1])
    folder.mkdir(parents=True)
    (folder / "BUILT").write_text("x.so\n")
    assert builders.is_built(group.solutions[1])
    notes.clear()
    runner.run_group(handle, group, root, BenchOptions(), note)
    assert notes == []


# ---------------------------------------------------------------------------------------
# Two benches on one dataset (Note [bench claims])


def test_a_run_another_live_bench_claimed_is_not_claimed_again(tmp_path):
    root = make_dataset(tmp_path / "ds", [], sizes=())
    first, second = Claims(root), Claims(root)
    a, b = solution("good_returns"), solution("good_dps")
    mine, theirs = first.claim("scale_h64", "n3", [a])
    assert [s.name for s in mine] == ["good_returns"] and not theirs
    mine, theirs = second.claim("scale_h64", "n3", [a, b])
    assert [s.name for s in mine] == ["good_dps"]
    ((who, runs),) = theirs.items()
    assert runs == 1 and who.startswith(f"pid {os.getpid()} on ")
    first.release()
    mine, theirs = second.claim("scale_h64", "n3", [a])
    assert [s.name for s in mine] == ["good_returns"] and not theirs
    second.release()
    assert list((root / ".fibgen" / "bench" / "claims").iterdir()) == []
    assert list((root / ".fibgen" / "bench" / "runs").iterdir()) == []


def test_the_claims_of_a_bench_that_was_killed_are_taken_over(tmp_path):
    root = make_dataset(tmp_path / "ds", [], sizes=())
    killed = Claims(root)
    killed.claim("scale_h64", "n3", [solution("good_returns")])
    os.close(killed.fd)  # what the kernel does to the lock of a process that dies
    later = Claims(root)
    mine, theirs = later.claim("scale_h64", "n3", [solution("good_returns")])
    assert [s.name for s in mine] == ["good_returns"] and not theirs
    later.release()


def test_the_claims_of_a_killed_bench_whose_child_holds_its_lock_are_taken_over(tmp_path):
    # A bench process claims a run and forks a child (as Ray's driver and the solution
    # processes do), which inherits the locked run file; then the bench is killed.
    root = make_dataset(tmp_path / "ds", [], sizes=())
    script = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from fibgen.bench.claims import Claims\n"
        "from types import SimpleNamespace\n"
        "c = Claims(Path(sys.argv[1]))\n"
        "c.claim('scale_h64', 'n3', [SimpleNamespace(name='good_returns')])\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "print(child, flush=True)\n"
        "time.sleep(60)\n"
    )
    bench = subprocess.Popen(
        [sys.executable, "-c", script, str(root)], stdout=subprocess.PIPE, text=True
    )
    child = int(bench.stdout.readline())
    try:
        bench.kill()
        bench.wait()
        later = Claims(root)
        mine, theirs = later.claim("scale_h64", "n3", [solution("good_returns")])
        assert [s.name for s in mine] == ["good_returns"] and not theirs
        later.release()
    finally:
        bench.kill()
        os.kill(child, signal.SIGKILL)  # it holds the lock still: the case of this test


@pytest.mark.slow
def test_bench_skips_the_runs_another_bench_is_running_and_says_so(tmp_path, capsys):
    root = make_dataset(tmp_path / "ds", ["good_returns", "good_dps"], sizes=(3, 5))
    other = Claims(root)
    # The other bench is running all of workload n3, and good_dps of n5.
    other.claim("scale_h64", "n3", [solution("good_returns"), solution("good_dps")])
    other.claim("scale_h64", "n5", [solution("good_dps")])
    who = json.loads(other.run_file.read_text())
    code = main(["bench", str(root), "--devices", "cpu", "--quiet", "--repeat", "3"])
    out, err = capsys.readouterr()
    assert code == 0
    assert out.splitlines()[0] == "1 traces written (PASSED 1); 0 already traced, skipped"
    assert (
        f"note: skipped 3 run(s) that another bench on {root} is running (pid {who['pid']} on "
        f"{who['host']}, started {who['started']}); its traces will hold them"
    ) in err.splitlines()
    lines = (root / "traces" / "scale" / "scale_h64.jsonl").read_text().splitlines()
    assert [(json.loads(t)["workload"]["uuid"], json.loads(t)["solution"]) for t in lines] == [
        ("n5", "good_returns")
    ]
    other.release()


def test_a_bench_whose_every_run_is_claimed_says_so(tmp_path, capsys):
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,))
    other = Claims(root)
    other.claim("scale_h64", "n3", [solution("good_returns")])
    code = main(["bench", str(root), "--devices", "cpu", "--quiet"])
    out, _ = capsys.readouterr()
    assert code == 0
    assert out.splitlines()[-1] == (
        "bench: nothing run (0 run(s) already traced, skipped, 1 run(s) by another bench)"
    )
    assert not Path(root / "traces").exists()
    other.release()
