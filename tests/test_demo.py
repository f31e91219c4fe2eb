"""The README's demo runs and shows a hit, a fallback and the stats."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_demo_runs():
    proc = subprocess.run(
        [sys.executable, "-m", "fibgen.demo"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "out= filled in place: True, max |diff| vs reference 0" in proc.stdout
    assert "'hit': 1, 'fallback_no_candidate': 1" in proc.stdout
