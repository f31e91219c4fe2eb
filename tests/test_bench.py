"""The benchmark runner and reports: statuses of bad solutions, timing of good ones, resume."""

from __future__ import annotations

import json
import sys
import tracemalloc
from pathlib import Path

import pytest

from fibgen.bench.report import ReportError, render, summarize
from fibgen.bench.runner import BenchOptions, run_bench
from fibgen.cli import main

from _bench_dataset import make_dataset, write_runs
from _shared import foreign_files, require_flashinfer_bench, require_module

REPO_DEFS = Path(__file__).resolve().parent.parent / "definitions"

EXPECTED = {
    "good_returns": "PASSED",
    "good_dps": "PASSED",
    "aborts": "RUNTIME_ERROR",
    "hangs": "TIMEOUT",
    "wrong_numbers": "INCORRECT_NUMERICAL",
    "wrong_shape": "INCORRECT_SHAPE",
    "wrong_dtype": "INCORRECT_DTYPE",
    "raises": "RUNTIME_ERROR",
    "bad_import": "COMPILE_ERROR",
    "wrong_later": "INCORRECT_NUMERICAL",
}


@pytest.fixture(scope="module")
def benched(tmp_path_factory):
    """One run over every kind of solution (spawning workers is the slow part: share it)."""
    root = tmp_path_factory.mktemp("bench")
    mp = pytest.MonkeyPatch()
    mp.setenv("FIBGEN_CACHE_DIR", str(root / "cache"))
    make_dataset(root / "ds", list(EXPECTED), sizes=(3, 17))
    summary = run_bench(root / "ds", BenchOptions(timeout=4, warmup=1, repeat=5), progress=False)
    yield root / "ds", summary
    mp.undo()


def _traces(root):
    lines = (root / "traces" / "scale" / "scale_h64.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.slow
def test_every_status_comes_out_and_good_solutions_are_timed(benched):
    root, summary = benched
    traces = _traces(root)
    assert len(traces) == 2 * len(EXPECTED) == summary.traces
    got = {(t["workload"]["uuid"], t["solution"]): t["evaluation"]["status"] for t in traces}
    assert got == {(w, s): status for w in ("n3", "n17") for s, status in EXPECTED.items()}
    for t in traces:
        evaluation = t["evaluation"]
        if evaluation["status"] == "PASSED":
            perf = evaluation["performance"]
            assert perf["latency_ms"] > 0 and perf["reference_latency_ms"] > 0
            assert perf["speedup_factor"] == pytest.approx(
                perf["reference_latency_ms"] / perf["latency_ms"]
            )
            # Beside the timer's figure, what the call costs in a loop of calls, and the
            # spread of its ratio to the reference over the paired rounds.
            assert perf["e2e_latency_ms"] > 0 and perf["reference_e2e_latency_ms"] > 0
            assert perf["e2e_spread"] >= 0
        else:
            assert "performance" not in evaluation and evaluation["log"]
    logs = {t["solution"]: t["evaluation"]["log"] for t in traces}
    assert "SIGABRT" in logs["aborts"]
    assert "not today" in logs["raises"]
    assert "no_such_module_here" in logs["bad_import"]
    assert logs["wrong_later"].startswith("after timing, a call of the solution: ")
    assert "[3, 63]" in logs["wrong_shape"] or "[17, 63]" in logs["wrong_shape"]


@pytest.mark.slow
def test_logs_name_the_solutions_own_files_not_the_build_cache(benched):
    # A Solution JSON's sources are named as "<json>: <source path>", with the line; the
    # copy under the cache that was imported is nowhere (Note [source names]).
    root, _ = benched
    logs = {t["solution"]: t["evaluation"]["log"] for t in _traces(root)}
    source = f"{root}/solutions/tester/scale/scale_h64/{{}}.json: main.py"
    assert logs["raises"].startswith(
        f'Traceback (most recent call last):\n  File "{source.format("raises")}", line 2, in run'
    )
    assert logs["bad_import"].endswith(
        "solution 'bad_import' for definition 'scale_h64' failed to load: ModuleNotFoundError: "
        f"No module named 'no_such_module_here' (in {source.format('bad_import')}, line 1)"
    )
    cache = str(root.parent / "cache")
    assert [s for s, log in logs.items() if cache in log] == []


@pytest.mark.slow
def test_a_bench_leaves_nothing_in_the_dataset_but_its_files(benched):
    # No lock files beside the traces (Note [lock files] in fibgen/fsutil.py), no temp files.
    root, _ = benched
    assert (root / "traces" / "scale" / "scale_h64.jsonl").is_file()
    assert foreign_files(root) == []


@pytest.mark.slow
def test_traces_load_with_the_format_and_flashinfer_bench(benched):
    root, _ = benched
    from fibgen.format import load_traces

    assert len(load_traces(root)) == 2 * len(EXPECTED)
    fib = require_flashinfer_bench()
    trace_set = fib.TraceSet.from_path(str(root))
    loaded = [t for traces in trace_set.traces.values() for t in traces]
    assert len(loaded) == 2 * len(EXPECTED)
    passed = [t for t in loaded if t.evaluation.performance is not None]
    assert passed and all(t.evaluation.performance.latency_ms > 0 for t in passed)


@pytest.mark.slow
def test_a_timeout_says_what_to_change(benched):
    root, _ = benched
    logs = {t["evaluation"]["log"] for t in _traces(root) if t["solution"] == "hangs"}
    assert logs == {
        "no result after 4 s: the solution hangs or is slower than that; if it is slow, give "
        "a longer --timeout (now 4 s)"
    }


@pytest.mark.slow
def test_resume_skips_what_is_traced(benched, tmp_path):
    root, _ = benched
    summary = run_bench(root, BenchOptions(resume=True, timeout=4), progress=False)
    assert summary.traces == 0 and summary.skipped == 2 * len(EXPECTED)


@pytest.mark.slow
def test_report_text_md_json(benched, tmp_path):
    root, _ = benched
    summary = summarize(root)
    ((hardware, table),) = summary["definitions"]["scale_h64"]["hardware"].items()
    # What bench records: the CPU model, as flashinfer-bench records it.
    assert hardware == _traces(root)[0]["evaluation"]["environment"]["hardware"]
    sols = table["solutions"]
    assert sols["good_dps"]["passed"] == 2 and sols["hangs"]["statuses"] == {"TIMEOUT": 2}
    assert sols["aborts"]["speedup"] is None and sols["good_returns"]["speedup"]["min"] > 0
    workloads = table["workloads"]
    assert [w["uuid"] for w in workloads] == ["n3", "n17"]
    assert all(w["best"] in ("good_returns", "good_dps") for w in workloads)
    assert all(w["best_e2e"] in ("good_returns", "good_dps") for w in workloads)
    assert all(w["e2e_latency_ms"] > 0 for w in workloads)
    assert sols["good_dps"]["e2e_speedup"]["min"] > 0
    text = render(summary, "text")
    assert f"scale_h64 on {hardware}" in text and "TIMEOUT 2" in text and "best solution" in text
    assert "best e2e" in text and "e2e speedup geomean" in text
    md = render(summary, "md")
    assert f"## scale_h64 on {hardware}" in md and "| good_dps | 2 | 0 | - |" in md
    assert json.loads(render(summary, "json")) == json.loads(json.dumps(summary))


def _peak(fn) -> int:
    """The most memory Python held at once while ``fn`` ran, in bytes."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_report_holds_its_figures_not_the_traces(tmp_path):
    # Note [reports in bounded memory]: 4 times the runs of the same solutions on the same
    # workloads and hardware, the same memory.
    roots = {runs: make_dataset(tmp_path / f"runs{runs}", []) for runs in (10, 40)}
    assert [write_runs(root, runs) for runs, root in roots.items()] == [120, 480]
    summarize(roots[10])  # imports and first-use caches come before the measurements
    small, large = (_peak(lambda root=root: summarize(root)) for root in roots.values())
    assert large < 1.5 * small, (small, large)
    # What it holds is the last run's figures.
    summary = summarize(roots[40])
    assert summary["superseded"] == 480 - 12
    for table in summary["definitions"]["scale_h64"]["hardware"].values():
        assert [w["latency_ms"] for w in table["workloads"]] == [40.0, 40.0]
        assert table["solutions"]["aborts"]["statuses"] == {"RUNTIME_ERROR": 2}


@pytest.mark.slow
def test_report_and_bench_cli(benched, tmp_path, capsys):
    root, _ = benched
    assert main(["report", str(root), "--format", "md"]) == 0
    assert "## scale_h64" in capsys.readouterr().out
    assert main(["report", str(tmp_path)]) == 1
    assert "no benchmark traces" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nonexistent")]) == 1
    err = capsys.readouterr().err
    assert err == f"error: dataset folder {tmp_path / 'nonexistent'} does not exist\n"
    assert main(["bench", str(root), "--resume", "--devices", "cpu", "--quiet"]) == 0
    assert "0 traces written" in capsys.readouterr().out
    assert main(["bench", str(tmp_path / "missing"), "--devices", "cpu"]) == 1
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # argparse's usage error
        main(["bench", str(root), "--devices", "cpu", "--flush", "sideways"])
    assert exc.value.code == 2
    assert "--flush: invalid choice: 'sideways'" in capsys.readouterr().err


def test_flush_option_is_checked_before_anything_runs(tmp_path):
    from fibgen.bench.runner import BenchError

    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,))
    with pytest.raises(BenchError, match="flush must be one of read, zero, none, not 'cold'"):
        run_bench(root, BenchOptions(flush="cold"), progress=False)
    assert not (root / "traces").exists()


def test_each_flush_runs_and_leaves_its_buffer_as_it_was(monkeypatch):
    # The flushers are torch calls that run on any device; a small buffer on the CPU
    # exercises the same calls a GPU run makes.
    import torch

    from fibgen.bench import timing

    monkeypatch.setattr(timing, "L2_FLUSH_BYTES", 4096)
    monkeypatch.setattr(timing, "_flush_buffers", {})
    cpu = torch.device("cpu")
    assert timing._flusher(cpu, "none") is None
    for flush in ("read", "zero"):
        timing._flusher(cpu, flush)()
    buf, sink = timing._flush_buffers[cpu]
    assert buf.numel() == 1024 and not buf.any() and sink.item() == 0


def test_timer_takes_the_flush_and_refuses_an_unknown_one():
    from fibgen.bench.timing import time_callable

    calls = []
    ms = time_callable(lambda: calls.append(1), "cpu", warmup=2, repeat=7, flush="zero")
    assert ms >= 0 and len(calls) == 9
    with pytest.raises(ValueError, match="flush must be one of read, zero, none"):
        time_callable(lambda: None, "cpu", warmup=1, repeat=1, flush="cold")


def test_e2e_rounds_follow_repeat_and_warmup_down_to_two_timed():
    from fibgen.bench.worker import E2E_ROUNDS, E2E_WARM_ROUNDS, e2e_rounds, e2e_warm_rounds

    # Unset or large: the full count. A quick run (--repeat 1): two, the least a spread needs.
    assert [e2e_rounds(r) for r in (None, 50, E2E_ROUNDS)] == [E2E_ROUNDS] * 3
    assert [e2e_rounds(r) for r in (1, 2, 3)] == [2, 2, 3]
    assert [e2e_warm_rounds(w) for w in (3, 2, 1, 0)] == [E2E_WARM_ROUNDS, 2, 1, 0]


@pytest.mark.slow
def test_plot_draws_speedups_on_a_log_axis(benched, tmp_path):
    require_module("matplotlib", "matplotlib is not installed (pip install 'fibgen[plot]')")
    root, _ = benched
    from fibgen.bench.report import figure, plot

    plot(summarize(root), tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0
    # Speedups are ratios: drawn on a log axis.
    assert [ax.get_yscale() for ax in figure(summarize(root)).axes] == ["log"]


@pytest.mark.slow
def test_plot_without_matplotlib_says_how_to_install_it(benched, tmp_path, monkeypatch):
    root, _ = benched
    from fibgen.bench.report import plot

    # None in sys.modules makes the import fail, as when matplotlib is not installed.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ReportError, match=r"pip install 'fibgen\[plot\]'"):
        plot(summarize(root), tmp_path / "p.png")
    assert not (tmp_path / "p.png").exists()


def test_sidecar_tolerance_and_hints_reach_the_runner(tmp_path):
    from fibgen.bench.runner import plan

    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,))
    sidecar = root / "definitions" / "scale" / "scale_h64.fibgen"
    sidecar.write_text(json.dumps({"tolerance": {"atol": 0.5}, "hints": {"w": "prob()"}}))
    (group,) = plan(root, BenchOptions()).groups
    assert group.tolerance == {"atol": 0.5, "rtol": None, "matched": None}
    assert group.hints == {"w": "prob()"}


def test_generated_sidecar_carries_the_fidef_tolerance(tmp_path):
    src = tmp_path / "defs"
    src.mkdir()
    text = (REPO_DEFS / "norm.fidef").read_text()
    text = text.replace(
        "family rmsnorm {\n  op_type rmsnorm\n",
        "family rmsnorm {\n  op_type rmsnorm\n  tolerance(atol=2e-2, rtol=3e-2, matched=0.99)\n",
        1,
    )
    (src / "norm.fidef").write_text(text)
    assert main(["build", str(src), "-o", str(tmp_path / "out")]) == 0
    sidecar = tmp_path / "out" / "definitions" / "rmsnorm" / "rmsnorm_h4096.fibgen"
    assert json.loads(sidecar.read_text()) == {
        "tolerance": {"atol": 2e-2, "rtol": 3e-2, "matched": 0.99}
    }
