"""Two packages of generated dispatchers standing for one API (Note [packages of one API])."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fibgen.cli import main

# Slow as a whole: builds packages and runs them in processes of their own.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

FIDEF = """\
family {family} {{
  op_type rmsnorm
  api fake_flashinfer.norm.rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None)

  rules {{
    eps == 1e-6
    ignore enable_pdl "when the kernel may start"
  }}

  axes {{
    batch_size  : var
    hidden_size : const h
  }}

  inputs {{
    hidden_states : {dtype}[batch_size, hidden_size] <- input
    weight        : {dtype}[hidden_size]
  }}

  outputs {{
    output : {dtype}[batch_size, hidden_size] -> out
  }}

  reference \"\"\"
    def run(hidden_states, weight):
        return hidden_states * weight
  \"\"\"

  instances {{
    h={h}
  }}
}}
"""

# Run in a process of its own: the packages it imports stay registered for the process.
SCRIPT = """\
import json, sys, warnings
import torch
import fake_flashinfer
import fibgen.runtime as rt

first, second = sys.argv[1:3]
__import__(first)  # a module: package.family
on = rt.enable_apply({
    "rmsnorm_h96": lambda hidden_states, weight: hidden_states + 1,
    "rmsnorm_fp16_h64": lambda hidden_states, weight: hidden_states + 2,
})
__import__(second)  # imported while apply is on
w96, w32 = (torch.ones(n, dtype=torch.bfloat16) for n in (96, 32))
x96, x32 = (torch.zeros(3, n, dtype=torch.bfloat16) for n in (96, 32))
w64, x64 = torch.ones(64, dtype=torch.float16), torch.zeros(3, 64, dtype=torch.float16)
got = [
    fake_flashinfer.norm.rmsnorm(x96, w96).max().item(),
    fake_flashinfer.norm.rmsnorm(x64, w64).max().item(),
    fake_flashinfer.norm.rmsnorm(x32, w32).max().item(),
]
stats = rt.stats()["fake_flashinfer.norm.rmsnorm"]
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    rt.disable_apply()
print(json.dumps({"got": got, "hit": stats["hit"], "miss": stats["fallback_no_candidate"]}))
"""


# Two families no one package could hold together: their names and dtypes differ, so
# neither's name rule spells the other's definitions.
PACKAGES = (
    ("bf16_kernels", "rmsnorm", "bfloat16", 96),
    ("fp16_kernels", "rmsnorm_fp16", "float16", 64),
)


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("two")
    for package, family, dtype, h in PACKAGES:
        source = out / f"{package}.fidef"
        source.write_text(FIDEF.format(family=family, dtype=dtype, h=h))
        built = out / package
        assert main(["build", str(source), "-o", str(built), "--package", package]) == 0
    return out


@pytest.mark.parametrize("order", ["bf16 first", "fp16 first"])
def test_each_package_routes_its_own_definitions_whichever_was_imported_last(packages, order):
    first, second = (f"{p}.{family}" for p, family, *_ in PACKAGES)
    if order == "fp16 first":
        first, second = second, first
    paths = [str(packages / p / "python") for p, *_ in PACKAGES] + [str(ROOT / "tests")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, first, second], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # h96 and h64 each reach their package's solution; h32, which neither knows, reaches the
    # original API once, counted once as a miss.
    assert result == {"got": [1.0, 2.0, 0.0], "hit": 2, "miss": 1}, textwrap.shorten(
        proc.stderr, 2000
    )
