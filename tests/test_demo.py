"""The README's demo runs and shows a hit, a fallback and the stats."""

import ast
import importlib.util
import subprocess
import sys

import pytest
import torch
from pathlib import Path

# Slow as a whole: runs the demo in a process of its own.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_demo_runs():
    proc = subprocess.run(
        [sys.executable, "-m", "fibgen.demo"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    # On this CPU FlashInfer's kernels cannot run (installed or not): what is not routed
    # runs the reference, and the demo says which.
    assert "apply off: rmsnorm(4, 4096) -> (4, 4096) (the reference)" in proc.stdout
    assert "out= filled in place: True, max |diff| vs the reference 0" in proc.stdout
    assert "rmsnorm_h2048 has no solution -> fallback to the reference, (2, 2048)" in proc.stdout
    (stats,) = [line for line in proc.stdout.splitlines() if line.startswith("stats()")]
    counts = ast.literal_eval(stats.split(": ", 2)[2])
    assert counts["hit"] == 1 and counts["error"] == 0
    assert sum(v for k, v in counts.items() if k.startswith("fallback_")) == 1
    flashinfer = importlib.util.find_spec("flashinfer") is not None
    note = "note: flashinfer-python is installed, but its kernels need a GPU"
    assert (note in proc.stdout) == (flashinfer and not torch.cuda.is_available())
