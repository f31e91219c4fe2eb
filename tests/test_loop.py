"""The loop the product exists for, end to end on the CPU: trace, bench, report, apply.

A two-layer Llama-shaped decode step calls the real FlashInfer 0.7.2 APIs through their
modules: ``flashinfer.norm.rmsnorm``, ``fused_add_rmsnorm``, ``flashinfer.activation.silu_and_mul``
and the paged decode wrapper, planned while tracing. FlashInfer's kernels cannot run here, so
their kernel modules (and the decode wrapper's constructor, plan and run) compute in torch
(``_flashinfer_cpu``), in this process and, through a ``sitecustomize``, in bench's workers;
every Python line of FlashInfer's APIs runs as it is.

1. The step is traced with ``patch=True`` into a dataset in FlashInfer-Bench's layout.
2. Each traced definition gets a FlashInfer-wrapper baseline, as FlashInfer-Bench's dataset has
   (``solutions/baseline/<op_type>/<name>/flashinfer_wrapper_*.json``: a Python solution that
   calls the API itself, through its module), and a second, plain-torch solution.
3. ``fibgen bench`` runs them; ``fibgen report`` summarizes.
4. ``enable_apply(dataset)`` routes the step: every call is dispatched once (a wrapper that calls
   the API it serves reaches FlashInfer's own function once, counted as nested), the counters
   add up to the calls made as the table chose, and the logits are apply-off's.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch

from _shared import foreign_files, require_module, run_applied

# Slow as a whole: trace, bench, report and apply end to end, in processes of their own.
pytestmark = pytest.mark.slow

flashinfer = require_module("flashinfer", "the loop runs the real FlashInfer's APIs")
import flashinfer.activation  # noqa: E402
import flashinfer.decode  # noqa: E402
import flashinfer.norm  # noqa: E402

import _flashinfer_cpu as cpu  # noqa: E402
import fibgen.runtime as rt  # noqa: E402
from fibgen.bench.runner import BenchOptions, run_bench  # noqa: E402
from fibgen.cli import main  # noqa: E402
from fibgen.runtime.selection import best as select  # noqa: E402
from fibgen.runtime.tracing.tracer import (
    disable_tracing,
    enable_tracing,
    tracing_stats,
)  # noqa: E402

H, HEADS, KV_HEADS, D, PAGE, INTER, LAYERS = 4096, 32, 8, 128, 64, 14336, 2
EPS = 1e-5
TRACED = (1, 2)

NAMES = {
    "rmsnorm": "rmsnorm_h4096",
    "fused_add_rmsnorm": "fused_add_rmsnorm_h4096",
    "silu_and_mul": "silu_and_mul_h14336_bf16",
    "decode": "gqa_paged_decode_h32_kv8_d128_ps64",
}
LABELS = {
    "rmsnorm": "flashinfer.norm.rmsnorm",
    "fused_add_rmsnorm": "flashinfer.norm.fused_add_rmsnorm",
    "silu_and_mul": "flashinfer.activation.silu_and_mul",
    "decode": "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run",
}
OP_TYPES = {
    "rmsnorm": "rmsnorm",
    "fused_add_rmsnorm": "rmsnorm",
    "silu_and_mul": "activation",
    "decode": "gqa_paged",
}
# Calls per step of each API.
CALLS = {
    "rmsnorm": LAYERS + 1,
    "fused_add_rmsnorm": LAYERS,
    "silu_and_mul": LAYERS,
    "decode": LAYERS,
}

# What FlashInfer-Bench's baseline solutions do: call the API, through its module.
WRAPPERS = {
    "rmsnorm": (
        True,
        "import flashinfer\n\n"
        "def run(hidden_states, weight, output):\n"
        f"    flashinfer.norm.rmsnorm(hidden_states, weight, eps={EPS}, out=output)\n",
    ),
    "fused_add_rmsnorm": (
        True,
        "import flashinfer\n\n"
        "def run(hidden_states, residual, weight, output):\n"
        "    h, r = hidden_states.clone(), residual.clone()\n"
        f"    flashinfer.norm.fused_add_rmsnorm(h, r, weight, eps={EPS})\n"
        "    output.copy_(h)\n",
    ),
    "silu_and_mul": (
        False,
        "import flashinfer\n\ndef run(x):\n    return flashinfer.activation.silu_and_mul(x)\n",
    ),
    "decode": (
        False,
        "import torch\nimport flashinfer\n\n"
        "def run(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale):\n"
        "    w = flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper(\n"
        "        torch.empty(1 << 20, dtype=torch.uint8), 'NHD')\n"
        f"    w.plan(kv_indptr, kv_indices, kv_last_page_len, {HEADS}, {KV_HEADS}, {D}, {PAGE},\n"
        "           sm_scale=float(sm_scale), q_data_type=torch.bfloat16)\n"
        "    return w.run(q, (k_cache, v_cache), return_lse=True)\n",
    ),
}
# A second solution each: plain torch, value-returning.
TORCH = {
    "rmsnorm": (
        "import torch\n\ndef run(hidden_states, weight):\n"
        "    x = hidden_states.float()\n"
        f"    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + {EPS}) * weight.float()\n"
        "    return y.to(hidden_states.dtype)\n"
    ),
    "fused_add_rmsnorm": (
        "import torch\n\ndef run(hidden_states, residual, weight):\n"
        "    x = hidden_states.float() + residual.float()\n"
        f"    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + {EPS}) * weight.float()\n"
        "    return y.to(hidden_states.dtype)\n"
    ),
    "silu_and_mul": (
        "import torch\n\ndef run(x):\n"
        "    gate, up = x.float().chunk(2, dim=-1)\n"
        "    return (torch.nn.functional.silu(gate) * up).to(x.dtype)\n"
    ),
}

SITE = """\
import os
if os.environ.get("FIBGEN_TEST_FLASHINFER_CPU") == "1":
    import pytest
    import _flashinfer_cpu as cpu
    patch = pytest.MonkeyPatch()
    cpu.norm_kernels_on_cpu(patch)
    cpu.activation_kernels_on_cpu(patch)
    cpu.decode_wrapper_on_cpu(patch)
"""


class Model:
    """Two decoder layers around FlashInfer's calls; the projections are fixed reshapes."""

    def __init__(self, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)

        def w(*shape: int, scale: float = 1.0) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) * scale + 1.0).to(torch.bfloat16)

        self.norms = [w(H, scale=0.1) for _ in range(LAYERS)]
        self.posts = [w(H, scale=0.1) for _ in range(LAYERS)]
        self.final = w(H, scale=0.1)
        self.head = (torch.randn(H, 64, generator=g) / 64).to(torch.bfloat16)
        pages = 12
        self.k = torch.randn(pages, PAGE, KV_HEADS, D, generator=g).to(torch.bfloat16)
        self.v = torch.randn(pages, PAGE, KV_HEADS, D, generator=g).to(torch.bfloat16)
        self.wrapper = flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper(
            torch.empty(1 << 20, dtype=torch.uint8), "NHD"
        )

    def plan(self, batch: int) -> None:
        """What an engine does before each step: plan the decode wrapper for the batch."""
        pages_per_seq = [1 + (b % 3) for b in range(batch)]
        indptr = torch.tensor([0] + list(torch.tensor(pages_per_seq).cumsum(0)), dtype=torch.int32)
        indices = torch.arange(int(indptr[-1]), dtype=torch.int32)
        last = torch.tensor([1 + (7 * b) % PAGE for b in range(batch)], dtype=torch.int32)
        self.wrapper.plan(
            indptr, indices, last, HEADS, KV_HEADS, D, PAGE, q_data_type=torch.bfloat16
        )

    def step(self, x: torch.Tensor) -> torch.Tensor:
        batch = x.shape[0]
        residual = torch.zeros_like(x)
        for norm, post in zip(self.norms, self.posts):
            h = flashinfer.norm.rmsnorm(x, norm, EPS)
            o = self.wrapper.run(h.view(batch, HEADS, D), (self.k, self.v)).reshape(batch, H)
            flashinfer.norm.fused_add_rmsnorm(o, residual, post, EPS)
            act = flashinfer.activation.silu_and_mul(torch.cat([o] * (2 * INTER // H), dim=-1))
            x = act[:, :H].contiguous()
        return flashinfer.norm.rmsnorm(x + residual, self.final, EPS).float() @ self.head.float()


@pytest.fixture()
def cpu_flashinfer(tmp_path, monkeypatch):
    """FlashInfer's kernels in torch here and in every process bench starts."""
    cpu.norm_kernels_on_cpu(monkeypatch)
    cpu.activation_kernels_on_cpu(monkeypatch)
    cpu.decode_wrapper_on_cpu(monkeypatch)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE, encoding="utf-8")
    tests = Path(__file__).resolve().parent
    path = os.pathsep.join(filter(None, [str(site), str(tests), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setenv("FIBGEN_TEST_FLASHINFER_CPU", "1")
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.disable_apply()
        disable_tracing()


def _solution(name: str, op_type: str, solution: str, source: str, dps: bool) -> dict:
    return {
        "name": solution,
        "definition": name,
        "author": "baseline" if solution.startswith("flashinfer_wrapper") else "tester",
        "spec": {
            "language": "python",
            "target_hardware": ["cpu", "cuda"],
            "entry_point": "main.py::run",
            "destination_passing_style": dps,
        },
        "sources": [{"path": "main.py", "content": source}],
        "description": f"{op_type} solution",
    }


def _write_solutions(root: Path) -> None:
    for api, name in NAMES.items():
        op_type = OP_TYPES[api]
        dps, source = WRAPPERS[api]
        solutions = [(f"flashinfer_wrapper_{api}", source, dps, "baseline")]
        if api in TORCH:
            solutions.append((f"torch_{api}", TORCH[api], False, "tester"))
        for solution, text, style, author in solutions:
            folder = root / "solutions" / author / op_type / name
            folder.mkdir(parents=True, exist_ok=True)
            data = _solution(name, op_type, solution, text, style)
            (folder / f"{solution}.json").write_text(json.dumps(data, indent=2), encoding="utf-8")


def _route(root: Path, table: dict, name: str, batch: int) -> str | None:
    """The solution the table chose for the traced key of a batch size; ORIGINAL; None when
    the definition is not routed."""
    info = table["definitions"].get(name)
    if info is None:
        return None
    if "keyed" not in info:
        return info["ranking"][0]
    definition = json.loads(next(root.glob(f"definitions/*/{name}.json")).read_text())
    var = [a for a, spec in definition["axes"].items() if spec["type"] == "var"]
    at = var.index("num_tokens" if "num_tokens" in var else "batch_size")
    (solution,) = [s for values, s in info["keyed"]["keys"] if values[at] == batch]
    return solution


def test_trace_bench_report_apply_on_flashinfers_apis(cpu_flashinfer, tmp_path, capsys):
    model = Model()
    root = tmp_path / "dataset"
    inputs = {
        b: torch.randn(b, H, generator=torch.Generator().manual_seed(b)).to(torch.bfloat16)
        for b in TRACED
    }

    # 1. Trace the step, apply off, FlashInfer's APIs patched; the wrapper planned while tracing.
    off = {}
    enable_tracing(root, patch=True, dedup="axes")
    try:
        for batch in TRACED:
            model.plan(batch)
            off[batch] = model.step(inputs[batch])
    finally:
        disable_tracing()
    stats = tracing_stats()
    assert stats["failed"] == 0 and stats["written"] >= len(NAMES) * len(TRACED), stats
    for api, name in NAMES.items():
        workloads = (root / "workloads" / OP_TYPES[api] / f"{name}.jsonl").read_text().splitlines()
        assert len(workloads) == len(TRACED), (name, workloads)
        assert (root / "definitions" / OP_TYPES[api] / f"{name}.json").is_file()

    # 2. A FlashInfer-wrapper baseline for every traced definition, and a torch solution.
    _write_solutions(root)
    assert foreign_files(root) == []

    # 3. Bench: every run passes; the e2e figure is of the routed call, beside FlashInfer's own.
    summary = run_bench(root, BenchOptions(devices=("cpu",), timeout=300), progress=False)
    runs = len(TRACED) * (len(NAMES) + len(TORCH))
    assert summary.statuses == {"PASSED": runs}, (summary.statuses, "\n".join(summary.problems))
    for path in summary.trace_files:
        for line in path.read_text().splitlines():
            trace = json.loads(line)
            perf = trace["evaluation"]["performance"]
            assert perf["e2e_routed"] is True, trace["evaluation"]["log"]
            assert perf["original_e2e_latency_ms"] > 0 and perf["original_latency_ms"] > 0
            assert "routed through the dispatcher of" in trace["evaluation"]["log"]
    assert foreign_files(root) == []
    capsys.readouterr()
    assert main(["report", str(root)]) == 0
    report = capsys.readouterr().out
    for name in NAMES.values():
        assert name in report

    # 4. Apply: the step as an engine runs it, routed as the table says.
    table = select.build_table(root)

    def steps() -> dict:
        out = {}
        for batch in TRACED:
            model.plan(batch)
            out[batch] = model.step(inputs[batch])
        return out

    on, counts = run_applied(root, steps)
    for batch in TRACED:
        torch.testing.assert_close(on[batch], off[batch], atol=5e-2, rtol=5e-2)
    for api, name in NAMES.items():
        expected = dict.fromkeys(("hit", "nested", "fallback_declined", "fallback_no_candidate"), 0)
        for batch in TRACED:
            choice = _route(root, table, name, batch)
            n = CALLS[api]
            if choice is None:
                # Nothing beats FlashInfer's own function: the API is not even patched, and its
                # calls reach FlashInfer at no cost (Note [idle paths]), uncounted.
                pass
            elif choice == select.ORIGINAL:
                expected["fallback_declined"] += n
            else:
                expected["hit"] += n
                if choice.startswith("flashinfer_wrapper"):
                    expected["nested"] += n  # the wrapper's own call of the API, once
        got = {k: v for k, v in counts.get(LABELS[api], {}).items() if k in expected}
        got = {k: got.get(k, 0) for k in expected}
        assert got == expected, (api, counts, table["definitions"].get(name), table["unused"])
        other = {
            k: v
            for k, v in counts.get(LABELS[api], {}).items()
            if k not in expected and k != "rules"
        }
        assert not any(other.values()), (api, other)

    # 5. The FlashInfer-wrapper baselines themselves, routed: each call reaches FlashInfer's
    # own function once from inside its solution, never the solution again.
    wrappers = {
        name: next((root / "solutions" / "baseline").rglob(f"flashinfer_wrapper_{api}.json"))
        for api, name in NAMES.items()
    }

    def last_step():
        cpu.CALLS.clear()
        model.plan(TRACED[-1])
        return model.step(inputs[TRACED[-1]])

    routed, counts = run_applied(wrappers, last_step)
    torch.testing.assert_close(routed, off[TRACED[-1]], atol=5e-2, rtol=5e-2)
    for api in NAMES:
        n = CALLS[api]
        assert {k: v for k, v in counts[LABELS[api]].items() if v} == {"hit": n, "nested": n}
    # The engine's plan, then per layer the wrapper's own plan and FlashInfer's run, once.
    assert cpu.CALLS == ["plan"] + ["plan", "run"] * LAYERS
