"""The loop for hand-written code, end to end: trace, bench, apply (on the CPU, and on a GPU
where there is one).

A small model routes its own functions by definition name, as flashinfer-bench's ``apply``
is used: a norm decorated with ``@apply(name)`` and an activation called through
``apply(name, args, fallback=...)``; on a GPU with FlashInfer installed, the model's own code
(the fallbacks) calls FlashInfer's rmsnorm and silu_and_mul, as an engine's does. Its calls
are traced with apply off (Note [recorded hand-written calls] in
fibgen/runtime/tracing/handwritten.py), each traced definition gets a solution of the other
calling style than its call's, ``fibgen bench`` runs them on the traced workloads, and
``enable_apply(dataset)`` routes the model's calls as the table says.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import fibgen.runtime as rt
from _shared import foreign_files, python_solution, run_applied
from fibgen.bench.runner import BenchOptions, run_bench
from fibgen.runtime.selection import best as select

# Slow as a whole: bench runs its workers in processes of their own.
pytestmark = pytest.mark.slow

NORM, ACT = "rmsnorm_h4096", "silu_and_mul_h14336_bf16"
OP_TYPES = {NORM: "rmsnorm", ACT: "activation"}
LABELS = {NORM: f"{__name__}.norm", ACT: f"fibgen.runtime.apply({ACT!r})"}
BATCHES = (1, 3)

# The solutions, each in the other style than the model calls it: the norm's writes into
# its output (destination-passing), the activation's returns its output.
SOLUTIONS = {
    NORM: (
        True,
        "import torch\n\n"
        "def run(hidden_states, weight, output):\n"
        "    x = hidden_states.float()\n"
        "    x = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5)\n"
        "    output.copy_(x * weight.float())\n",
    ),
    ACT: (
        False,
        "import torch.nn.functional as F\n\n"
        "def run(x):\n"
        "    gate, up = x.float().chunk(2, dim=-1)\n"
        "    return (F.silu(gate) * up).to(x.dtype)\n",
    ),
}


def _flashinfer():
    """FlashInfer, where its kernels can run (a GPU and the package): the model's own code
    calls it, as an engine's does; else None."""
    if not torch.cuda.is_available():
        return None
    try:
        import flashinfer.activation
        import flashinfer.norm
    except ImportError:
        return None
    return flashinfer


@rt.apply(NORM)
def norm(hidden_states, weight):
    flashinfer = _flashinfer() if hidden_states.is_cuda else None
    if flashinfer is not None:
        return flashinfer.norm.rmsnorm(hidden_states, weight, 1e-5)
    x = hidden_states.float()
    x = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5)
    return (x * weight.float()).to(hidden_states.dtype)


def _silu_and_mul(x):
    flashinfer = _flashinfer() if x.is_cuda else None
    if flashinfer is not None:
        return flashinfer.activation.silu_and_mul(x)
    gate, up = x.float().chunk(2, dim=-1)
    return (F.silu(gate) * up).to(x.dtype)


def step(hidden, weight):
    normed = norm(hidden, weight)
    return rt.apply(ACT, (normed.repeat(1, 7),), fallback=_silu_and_mul)


@pytest.fixture(autouse=True)
def _clean(monkeypatch, tmp_path):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.disable_apply()
        rt.disable_tracing()


def _write_solutions(root: Path) -> None:
    for name, (dps, source) in SOLUTIONS.items():
        folder = root / "solutions" / "tester" / OP_TYPES[name] / name
        folder.mkdir(parents=True)
        solution = python_solution(f"torch_{name}", name, source, dps=dps, hardware=("cpu", "cuda"))
        (folder / f"torch_{name}.json").write_text(json.dumps(solution), encoding="utf-8")


def _logs(summary) -> list[str]:
    """The logs of the runs that did not pass, for a failure's message."""
    logs = []
    for path in summary.trace_files:
        for line in path.read_text(encoding="utf-8").splitlines():
            evaluation = json.loads(line)["evaluation"]
            if evaluation["status"] != "PASSED":
                logs.append(f"{evaluation['status']}: {evaluation.get('log', '')[-3000:]}")
    return logs


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_trace_bench_apply_of_hand_written_code(tmp_path, device):
    root = tmp_path / "dataset"
    weight = torch.randn(4096, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    weight = weight.to(device)
    hidden = {
        b: torch.randn(b, 4096, generator=torch.Generator().manual_seed(b))
        .to(torch.bfloat16)
        .to(device)
        for b in BATCHES
    }

    # 1. Trace, apply off: the model's own code runs, each call recorded.
    rt.enable_tracing(root, dedup="axes")
    try:
        off = {b: step(hidden[b], weight) for b in BATCHES}
        rt.flush_tracing()
        stats = rt.tracing_stats()
    finally:
        rt.disable_tracing()
    assert (stats["recorded"], stats["written"], stats["handwritten"]) == (4, 4, 0), stats
    for name, op_type in OP_TYPES.items():
        lines = (root / "workloads" / op_type / f"{name}.jsonl").read_text().splitlines()
        axes = [list(json.loads(line)["workload"]["axes"].values()) for line in lines]
        assert axes == [[b] for b in BATCHES], (name, axes)
        assert (root / "definitions" / op_type / f"{name}.json").is_file()

    # 2. Bench the solutions on the traced workloads.
    _write_solutions(root)
    summary = run_bench(root, BenchOptions(devices=(device,), timeout=300), progress=False)
    assert summary.statuses == {"PASSED": 4}, (summary.statuses, summary.problems, _logs(summary))
    assert foreign_files(root) == []

    # 3. Apply: each call goes where the table says, and computes what the model's own did.
    table = select.build_table(root)
    on, counts = run_applied(root, lambda: {b: step(hidden[b], weight) for b in BATCHES})
    for b in BATCHES:
        torch.testing.assert_close(on[b], off[b], atol=2e-2, rtol=2e-2)
    for name, label in LABELS.items():
        info = table["definitions"].get(name)
        if info is None:
            # Nothing beats FlashInfer's own function (on a GPU, what the model's code calls):
            # the name is not routed, and its calls run the model's own code.
            expected = {"fallback_no_candidate": len(BATCHES)}
        else:
            assert "keyed" not in info, info  # one solution per definition: no keys
            routed = info["ranking"][0] != select.ORIGINAL
            expected = {"hit": len(BATCHES)} if routed else {"fallback_declined": len(BATCHES)}
        got = {k: v for k, v in counts[label].items() if v and k != "rules"}
        assert got == expected, (name, counts[label], info)
