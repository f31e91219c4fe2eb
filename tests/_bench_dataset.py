"""Small datasets for the benchmark tests: one definition with python solutions good and bad,
and a sampler with samplers right and wrong."""

from __future__ import annotations

import json
from pathlib import Path

from fibgen.format import (
    Definition,
    Solution,
    Workload,
    write_definition,
    write_solution,
    write_workloads,
)

CATALOGUE = Path(__file__).resolve().parents[1] / "generated" / "definitions"

REFERENCE = """
import torch

def run(x, w):
    return (x.float() * w.float()).to(x.dtype)
"""

DEFINITION = {
    "name": "scale_h64",
    "op_type": "scale",
    "tags": [],
    "axes": {"n": {"type": "var"}, "h": {"type": "const", "value": 64}},
    "inputs": {
        "x": {"shape": ["n", "h"], "dtype": "float32"},
        "w": {"shape": ["h"], "dtype": "float32"},
    },
    "outputs": {"y": {"shape": ["n", "h"], "dtype": "float32"}},
    "reference": REFERENCE,
}

# name -> (entry source, destination-passing)
SOLUTIONS = {
    "good_returns": ("def run(x, w):\n    return x * w\n", False),
    "good_dps": ("def run(x, w, y):\n    y.copy_(x)\n    y.mul_(w)\n", True),
    "slow_returns": (
        "import time\n\ndef run(x, w):\n    time.sleep(0.002)\n    return x * w\n",
        False,
    ),
    "aborts": ("import os\n\ndef run(x, w):\n    os.abort()\n", False),
    "hangs": ("import time\n\ndef run(x, w):\n    while True:\n        time.sleep(1)\n", False),
    "wrong_numbers": ("def run(x, w):\n    return x * w + 1\n", False),
    "wrong_shape": ("def run(x, w):\n    return (x * w)[:, :-1]\n", False),
    "wrong_dtype": ("def run(x, w):\n    return (x * w).double()\n", False),
    "raises": ("def run(x, w):\n    raise ValueError('not today')\n", False),
    "bad_import": ("import no_such_module_here\n\ndef run(x, w):\n    return x\n", False),
    # Right on its first call only: the calls bench times must be right too.
    "wrong_later": (
        "calls = []\n\ndef run(x, w):\n    calls.append(1)\n"
        "    return x * w if len(calls) == 1 else x * w + 1\n",
        False,
    ),
}


def solution(name: str, author: str = "tester") -> Solution:
    """One of the test solutions as a Solution model."""
    source, dps = SOLUTIONS[name]
    return Solution.model_validate(
        {
            "name": name,
            "definition": DEFINITION["name"],
            "author": author,
            "spec": {
                "language": "python",
                "target_hardware": ["cpu"],
                "entry_point": "main.py::run",
                "destination_passing_style": dps,
            },
            "sources": [{"path": "main.py", "content": source}],
        }
    )


def make_dataset(root: Path, names: list[str], sizes: tuple[int, ...] = (3, 17)) -> Path:
    """Write the definition, workloads of the given row counts and the named solutions."""
    definition = Definition.model_validate(DEFINITION)
    write_definition(root, definition)
    workloads = [
        Workload.model_validate(
            {
                "uuid": f"n{n}",
                "axes": {"n": n},
                "inputs": {"x": {"type": "random"}, "w": {"type": "random"}},
            }
        )
        for n in sizes
    ]
    write_workloads(root, definition.op_type, definition.name, workloads)
    for name in names:
        write_solution(root, solution(name), definition.op_type)
    return root


SAMPLER = "top_k_sampling_from_probs_v64"

SAMPLERS = {
    # Correct, but draws differently from the reference (Gumbel-max, its own generator).
    "gumbel": (
        "import torch\n\n"
        "def run(probs, top_k, samples):\n"
        "    k = top_k.to(torch.int64).unsqueeze(-1)\n"
        "    vals, idx = probs.sort(dim=-1, descending=True)\n"
        "    keep = torch.arange(probs.shape[-1]) < k\n"
        "    logp = torch.where(keep, vals.log(), float('-inf'))\n"
        "    g = -torch.empty_like(logp).exponential_().log()\n"
        "    samples.copy_(idx.gather(-1, (logp + g).argmax(-1, keepdim=True)).squeeze(-1))\n"
    ),
    "argmax": ("def run(probs, top_k, samples):\n    samples.copy_(probs.argmax(-1))\n"),
    "ignores_top_k": (
        "import torch\n\n"
        "def run(probs, top_k, samples):\n"
        "    samples.copy_(torch.multinomial(probs, 1).squeeze(-1))\n"
    ),
}


def make_sampling_dataset(root: Path, names: tuple[str, ...] = tuple(SAMPLERS)) -> Path:
    """A top-k sampler of 64 tokens, one workload of 4 rows, and the named samplers."""
    source = json.loads(
        (CATALOGUE / "sampling" / "top_k_sampling_from_probs_v128256.json").read_text()
    )
    source["name"] = SAMPLER
    source["axes"]["vocab_size"]["value"] = 64
    definition = Definition.model_validate(source)
    write_definition(root, definition, {"hints": {"probs": "prob()", "top_k": "range(2, 9)"}})
    workloads = [
        Workload.model_validate(
            {"uuid": f"b{n}", "axes": {"batch_size": n}, "inputs": {"probs": {"type": "random"},
                                                                     "top_k": {"type": "random"}}}
        )
        for n in (4,)
    ]  # fmt: skip
    write_workloads(root, "sampling", SAMPLER, workloads)
    for name in names:
        write_solution(
            root,
            Solution.model_validate(
                {
                    "name": name,
                    "definition": SAMPLER,
                    "author": "tester",
                    "spec": {
                        "language": "python",
                        "target_hardware": ["cpu"],
                        "entry_point": "main.py::run",
                    },
                    "sources": [{"path": "main.py", "content": SAMPLERS[name]}],
                }
            ),
            "sampling",
        )
    return root


HARDWARE = ("NVIDIA H100 80GB HBM3", "NVIDIA H200")


def write_runs(
    root: Path,
    runs: int,
    solutions: tuple[str, ...] = ("good_returns", "good_dps", "aborts"),
    sizes: tuple[int, ...] = (3, 17),
) -> int:
    """Append to traces/ ``runs`` runs of each solution on each workload (of ``make_dataset``)
    and each of ``HARDWARE``, run ``r`` at latency ``r + 1`` ms; the number of lines written."""
    path = root / "traces" / "scale" / "scale_h64.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for run in range(runs):
        for name in solutions:
            for n in sizes:
                for hardware in HARDWARE:
                    evaluation = {
                        "status": "RUNTIME_ERROR",
                        "environment": {"hardware": hardware, "libs": {"torch": "2.13.0"}},
                        "timestamp": f"2026-12-01T00:00:{run % 60:02d}",
                        "log": "RuntimeError: not today",
                    }
                    if name != "aborts":
                        latency = float(run + 1)
                        evaluation.update(
                            status="PASSED",
                            log="",
                            correctness={"max_relative_error": 0.0, "max_absolute_error": 0.0},
                            performance={
                                "latency_ms": latency,
                                "reference_latency_ms": 2 * latency,
                                "speedup_factor": 2.0,
                            },
                        )
                    trace = {
                        "definition": "scale_h64",
                        "solution": name,
                        "workload": {
                            "uuid": f"n{n}",
                            "axes": {"n": n},
                            "inputs": {"x": {"type": "random"}, "w": {"type": "random"}},
                        },
                        "evaluation": evaluation,
                    }
                    lines.append(json.dumps(trace) + "\n")
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(lines)
    return len(lines)
