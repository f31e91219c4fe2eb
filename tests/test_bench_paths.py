"""`fibgen bench` cannot mislead: filters, devices, empty runs, samplers, timings, verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fibgen.bench.runner import (
    BenchError,
    BenchOptions,
    DeviceError,
    check_devices,
    load_extras,
    plan,
    run_bench,
)
from fibgen.cli import main
from fibgen.format import Definition, write_definition

from _shared import require_module
from _bench_dataset import (
    DEFINITION,
    SAMPLER,
    make_dataset,
    make_sampling_dataset,
    solution,
)

REPO = Path(__file__).resolve().parents[1]
CATALOGUE = REPO / "generated" / "definitions"


def _bench(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["bench", *args])
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------------------
# Nothing is run in silence


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--definitions", "scale_h8*"],
            "error: --definitions 'scale_h8*' matches no definition of {root}; it has: scale_h64",
        ),
        (
            ["--solutions", "good_retruns"],
            "error: --solutions 'good_retruns' matches no solution of {root} and is no file or "
            "folder; the solutions are: good_dps, good_returns",
        ),
    ],
)
def test_a_filter_that_selects_nothing_is_an_error_listing_what_there_is(
    tmp_path, capsys, args, message
):
    root = make_dataset(tmp_path / "ds", ["good_returns", "good_dps"], sizes=(3,))
    code, out, err = _bench(capsys, str(root), "--devices", "cpu", "--quiet", *args)
    assert code == 1 and out == ""
    assert err.strip() == message.format(root=root)
    assert not (root / "traces").exists()


def test_a_dataset_with_nothing_to_run_says_why(tmp_path, capsys):
    root = make_dataset(tmp_path / "ds", [], sizes=(3,))
    code, _, err = _bench(capsys, str(root), "--devices", "cpu", "--quiet")
    assert code == 1
    assert err.startswith(f"error: nothing to run in {root}: {root}/solutions holds no solution")
    # Solutions, but no workloads for their definition: said, not skipped in silence.
    (root / "workloads").rename(tmp_path / "aside")
    from fibgen.format import write_solution

    write_solution(root, solution("good_returns"), "scale")
    code, _, err = _bench(capsys, str(root), "--devices", "cpu", "--quiet")
    assert code == 1 and "not run: no workloads for scale_h64 (make some with `fibgen" in err


@pytest.mark.parametrize(
    "devices, cuda_count, message",
    [
        ("gpu0", 0, "--devices 'gpu0' is not a device; write cpu, cuda or cuda:N"),
        ("cuda:0", 0, "--devices 'cuda:0': this machine has no CUDA device"),
        ("cuda:0,cuda:1", 1, "--devices 'cuda:1': this machine has 1 CUDA device(s): cuda:0"),
        ("", 0, "--devices '' is not a device"),
    ],
)
def test_devices_are_checked_against_the_machine_first(
    tmp_path, capsys, monkeypatch, devices, cuda_count, message
):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda_count)
    with pytest.raises(DeviceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_devices(tuple(devices.split(",")))
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,))
    code, _, err = _bench(capsys, str(root), "--devices", devices, "--quiet")
    assert code == 2 and message in err
    assert not (root / "traces").exists()
    assert check_devices(("cpu", "cpu")) == ("cpu", "cpu")


def test_cuda_without_an_index_is_the_first_device(monkeypatch):
    # As the workers take it: a worker of "cuda" failed to start ("Expected a torch.device
    # with a specified index").
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_devices(("cuda", "cpu", "cuda:1")) == ("cuda:0", "cpu", "cuda:1")


# ---------------------------------------------------------------------------------------
# Verdicts, timings and packing


@pytest.mark.slow
def test_a_run_with_failures_says_so_in_its_last_line(tmp_path, capsys):
    root = make_dataset(tmp_path / "ds", ["good_returns", "wrong_numbers"], sizes=(3, 5))
    code, out, _ = _bench(capsys, str(root), "--devices", "cpu", "--quiet", "--repeat", "3")
    assert code == 1
    assert out.splitlines()[-1] == (
        "bench: FAILED: 2 of 4 run(s) did not pass (INCORRECT_NUMERICAL 2); "
        f"see `fibgen report {root}`"
    )
    code, out, _ = _bench(capsys, str(root), "--devices", "cpu", "--quiet", "--solutions", "good_*")
    assert code == 0 and out.splitlines()[-1] == "bench: all 2 run(s) PASSED"


@pytest.mark.slow
def test_solution_files_alone_run_only_those_and_a_folder_of_none_is_an_error(tmp_path, capsys):
    from fibgen.format import write_solution

    root = make_dataset(tmp_path / "ds", ["good_returns", "wrong_numbers"], sizes=(3,))
    elsewhere = tmp_path / "mine"
    write_solution(elsewhere, solution("good_dps"), "scale")
    code, out, _ = _bench(
        capsys, str(root), "--devices", "cpu", "--quiet", "--solutions", str(elsewhere)
    )
    assert code == 0 and out.splitlines()[-1] == "bench: all 1 run(s) PASSED", out
    traced = [
        json.loads(line)["solution"]
        for line in (root / "traces" / "scale" / "scale_h64.jsonl").read_text().splitlines()
    ]
    assert traced == ["good_dps"]
    (tmp_path / "empty").mkdir()
    code, _, err = _bench(
        capsys, str(root), "--devices", "cpu", "--solutions", str(tmp_path / "empty")
    )
    assert code == 1 and "the folder holds no Solution JSON" in err, err


class _FakeCPU:
    """A CPU on which every timed call takes ``call_ms``: its clock moves only when one is
    made, so bench's figures are exact, however busy the machine running the tests is."""

    def __init__(self, call_ms: float) -> None:
        self.now_ns = 0
        self.call_ns = round(call_ms * 1e6)

    def clock(self) -> int:
        return self.now_ns

    def charged(self, fn):
        """``fn``, run as it is, each call charged ``call_ms`` on this CPU's clock."""

        def call():
            result = fn()
            self.now_ns += self.call_ns
            return result

        return call


class _WorkerHere:
    """The runner's handle on a worker that runs in this process, where the fake clock is."""

    process = object()  # never gone

    def __init__(self, device: str) -> None:
        from fibgen.bench.worker import Worker

        self.worker = Worker(device)

    def ask(self, request, timeout: float):
        from fibgen.bench import messages

        if isinstance(request, messages.Prepare):
            return self.worker.prepare(request)
        return self.worker.run(request)

    def stop(self) -> None:
        pass

    close = signal_kill = stop


def test_cpu_timings_are_medians_of_many_calls_with_their_spread(tmp_path, monkeypatch):
    from fibgen.bench import runner, timing, worker

    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = make_dataset(tmp_path / "ds", [], sizes=(3, 34))
    # A solution that is the reference itself: reference and solution are timed alike, so
    # its speedup is 1 at every size (it was 248x and 1086x with a 5-call reference).
    from fibgen.format import Solution, write_solution

    write_solution(
        root,
        Solution.model_validate(
            {
                **solution("good_returns").model_dump(),
                "name": "same_as_reference",
                "sources": [{"path": "main.py", "content": DEFINITION["reference"]}],
            }
        ),
        "scale",
    )
    # Timed on a fake CPU where every call takes 10 ms, by a worker in this process (and the
    # solution not isolated), so that what is compared below is exact, not measured.
    cpu = _FakeCPU(call_ms=10.0)
    measure = timing.measure
    monkeypatch.setattr(timing, "_clock", cpu.clock)
    monkeypatch.setattr(
        timing, "measure", lambda fn, device, **kw: measure(cpu.charged(fn), device, **kw)
    )
    monkeypatch.setattr(runner, "Handle", _WorkerHere)
    monkeypatch.setattr(worker, "setup_device", lambda device: None)  # this process's threads
    summary = run_bench(root, BenchOptions(devices=("cpu",), isolate=False), progress=False)
    assert summary.statuses == {"PASSED": 2}, summary
    (path,) = summary.trace_files
    for trace in map(json.loads, path.read_text().splitlines()):
        evaluation = trace["evaluation"]
        log = evaluation["log"]
        assert log.startswith("timing: median 10 ms ") and "; reference: median 10 ms " in log
        timings = log.split(";")[:2]  # the solution's and the reference's; then e2e notes
        samples = [int(part.split(" samples")[0].rsplit(" ", 1)[1]) for part in timings]
        # Calls of 10 ms would fill TARGET_MS with 10 samples: both take the floor of 30.
        assert samples == [timing.CPU_MIN_REPEAT] * 2, log
        performance = evaluation["performance"]
        assert performance["latency_ms"] == performance["reference_latency_ms"] == 10.0
        assert performance["speedup_factor"] == 1.0


@pytest.mark.slow
def test_an_edited_solution_folder_is_run_as_it_is_and_packed(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = make_dataset(tmp_path / "ds", [], sizes=(3,))
    assert (
        main(
            ["scaffold-solution", "scale_h64", "--language", "python", "--author", "me"]
            + ["-o", str(root / "solutions"), "--definitions", str(_scale_fidef(tmp_path))]
        )
        == 0
    )
    folder = next((root / "solutions").glob("me/*/scale_h64/python_scale_h64"))
    json_path = folder / "python_scale_h64.json"
    capsys.readouterr()
    code, out, _ = _bench(capsys, str(root), "--devices", "cpu", "--quiet", "--repeat", "2")
    assert code == 0, out
    main_py = folder / "main.py"
    main_py.write_text(main_py.read_text().replace("return ", "return 1 + ", 1))
    code, out, err = _bench(
        capsys, str(root), "--devices", "cpu", "--quiet", "--repeat", "2", "--resume"
    )
    # --resume does not skip it: its traces are of other sources.
    assert code == 1 and "INCORRECT_NUMERICAL 1" in out.splitlines()[-1]
    assert f"note: packed 1 solution folder(s) whose files changed" in err
    assert json.loads(json_path.read_text())["sources"][0]["content"] == main_py.read_text()


def _scale_fidef(tmp_path: Path) -> Path:
    path = tmp_path / "scale.fidef"
    path.write_text(
        "family scale {\n  op_type scale\n  axes {\n    n : var\n    h : const h\n  }\n"
        "  inputs {\n    x : float32[n, h]\n    w : float32[h]\n  }\n"
        "  outputs {\n    y : float32[n, h]\n  }\n"
        '  reference """\n    import torch\n\n    def run(x, w):\n'
        '        return (x.float() * w.float()).to(x.dtype)\n  """\n'
        "  instances {\n    h=64\n  }\n}\n"
    )
    return path


# ---------------------------------------------------------------------------------------
# Sidecars of a dataset written elsewhere


def test_a_definition_without_sidecar_takes_the_catalogues_when_its_contract_is_the_same(
    tmp_path,
):
    name = "gqa_paged_decode_h32_kv8_d128_ps1"
    source = json.loads((CATALOGUE / "gqa_paged" / f"{name}.json").read_text())
    source["description"] = "written by someone else"
    path = write_definition(tmp_path, Definition.model_validate(source))
    builtin = json.loads((CATALOGUE / "gqa_paged" / f"{name}.fibgen").read_text())
    assert load_extras(path, Definition.model_validate(source)) == builtin
    source["inputs"]["q"]["dtype"] = "float16"
    other = Definition.model_validate(source)
    assert load_extras(write_definition(tmp_path, other), other) == {}


# ---------------------------------------------------------------------------------------
# Samplers are judged by their distribution


@pytest.mark.slow
def test_a_sampler_is_judged_by_its_distribution(tmp_path, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = make_sampling_dataset(tmp_path / "ds")
    summary = run_bench(root, BenchOptions(devices=("cpu",), repeat=2, timeout=300), progress=False)
    (path,) = summary.trace_files
    traces = {
        t["solution"]: t["evaluation"] for t in map(json.loads, path.read_text().splitlines())
    }
    assert {s: e["status"] for s, e in traces.items()} == {
        "gumbel": "PASSED",
        "argmax": "INCORRECT_NUMERICAL",
        "ignores_top_k": "INCORRECT_NUMERICAL",
    }
    extra = traces["gumbel"]["correctness"]["extra"]
    assert extra["tvd"] <= 0.2 and len(extra["tvds_per_batch"]) == 4 and extra["draws"] >= 1000
    assert "total variation distance" in traces["argmax"]["log"]
    assert "outside its valid top_k set" in traces["ignores_top_k"]["log"]
    # The verdict in flashinfer-bench's terms (Note [sampler traces]): a pass has no error, a
    # token outside the valid set infinite ones, a distribution too far off its frequencies'.
    errors = {
        s: (e["correctness"]["max_absolute_error"], e["correctness"]["max_relative_error"])
        for s, e in traces.items()
    }
    assert errors["gumbel"] == (0.0, 0.0)
    assert 0 < extra["frequency_max_absolute_error"] <= extra["frequency_max_relative_error"]
    assert errors["ignores_top_k"] == ("Infinity", "Infinity")
    argmax = traces["argmax"]["correctness"]
    assert errors["argmax"] == (
        argmax["extra"]["frequency_max_absolute_error"],
        argmax["extra"]["frequency_max_relative_error"],
    )
    assert argmax["extra"]["tvd"] > 0.2 and errors["argmax"][0] > 0.1


SLOW_REFERENCE = """
import time

import torch


def run(probs, top_k):
    # A second per thousand rows: the draws that judge a sampler outlast a short --timeout.
    time.sleep(0.001 * probs.shape[0])
    k = top_k.to(torch.int64).unsqueeze(-1)
    vals, idx = probs.sort(dim=-1, descending=True)
    kept = torch.where(torch.arange(probs.shape[-1]) < k, vals, torch.zeros_like(vals))
    return idx.gather(-1, torch.multinomial(kept, 1)).squeeze(-1)
"""


@pytest.mark.slow
def test_a_sampler_not_judged_in_time_is_a_timeout_that_says_what_to_change(tmp_path, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = make_sampling_dataset(tmp_path / "ds")
    path = root / "definitions" / "sampling" / f"{SAMPLER}.json"
    doc = json.loads(path.read_text())
    doc["reference"] = SLOW_REFERENCE
    path.write_text(json.dumps(doc))
    options = BenchOptions(devices=("cpu",), solutions=("gumbel",), repeat=1, warmup=0, timeout=2)
    summary = run_bench(root, options, progress=False)
    (path,) = summary.trace_files
    (trace,) = map(json.loads, path.read_text().splitlines())
    evaluation = trace["evaluation"]
    # The worker answers before the runner's limit (5 times --timeout for a sampler), with
    # the time judging would take and the --timeout that gives it.
    assert evaluation["status"] == "TIMEOUT", evaluation
    log = evaluation["log"]
    assert log.startswith("output 'samples': not judged within "), log
    assert "1000 draws per row of the reference took " in log
    assert "give --timeout " in log and "(a sampler gets 5 times --timeout)" in log


def test_the_bench_help_gives_the_sampler_timeout_scale(capsys):
    from fibgen.runtime.checking.compare import SAMPLING_TIMEOUT_SCALE

    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"(120; a sampler gets {SAMPLING_TIMEOUT_SCALE} times it)" in text


def test_flashinfers_own_function_is_not_given_host_tensors_on_a_machine_with_a_gpu(
    monkeypatch,
):
    # Its kernels take CUDA tensors and do not check: given host tensors where a GPU is, they
    # launch on host addresses and the process's CUDA context fails (seen on an H200: an
    # illegal memory access, then every run of that worker a RUNTIME_ERROR).
    import torch

    from fibgen.bench.worker import cuda_only

    def own(x):
        return x

    cpu, gpu = torch.device("cpu"), torch.device("cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    own.__module__ = "flashinfer.activation"
    assert "takes CUDA tensors" in cuda_only(own, cpu)
    assert cuda_only(own, gpu) is None
    own.__module__ = "my_engine.kernels"  # another API's own function: called as ever
    assert cuda_only(own, cpu) is None
    own.__module__ = "flashinfer.activation"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_only(own, cpu) is None  # it raises, or runs a stand-in: tried as ever


def test_the_real_flashinfers_own_functions_are_told_apart(monkeypatch):
    # The guard above reads the original's module: the real package's functions, as
    # ApiCall.original gets them (the API's own function, not fibgen's dispatcher).
    import torch

    require_module("flashinfer", "the guard is checked against the real FlashInfer")
    import flashinfer.activation
    import flashinfer.norm

    from fibgen.bench.worker import cuda_only

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for own in (flashinfer.norm.rmsnorm, flashinfer.activation.silu_and_mul):
        assert "takes CUDA tensors" in cuda_only(own, torch.device("cpu")), own
        assert cuda_only(own, torch.device("cuda:0")) is None
    assert cuda_only(torch.nn.functional.silu, torch.device("cpu")) is None
