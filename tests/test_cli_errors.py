"""Every `fibgen` command, given wrong input of each kind, as a user would give it.

Each case runs `python -m fibgen ...` in a process of its own (forked from one that has
imported torch: Note [the command server] in tests/_cli_server.py), in its own copy of a
workspace that holds what the commands take (a `.fidef` folder, a dataset, a solution
folder, traces) and what they must refuse (a missing path, a file where a folder is
expected, an empty folder, a `.fidef` with errors). A case fails on a Python traceback, on
an exit code other than the one the rule gives (Note [exit codes] in fibgen/cli/console.py:
1 the input is wrong, 2 the command line is), on a message that does not say `error:` once
at its start, and on any file written or changed in the workspace.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fibgen.cli import main

from _cli_server import CommandServer

INPUT, USAGE = 1, 2  # the rule's exit codes for a wrong input and a wrong command line

NORM = """\
family norm {
  op_type norm
  axes {
    n : var
    h : const h
  }
  inputs {
    x : float32[n, h]
  }
  outputs {
    y : float32[n, h]
  }
  reference \"\"\"
    def run(x):
        return x
  \"\"\"
  instances {
    h=8
  }
}
"""

# An error of meaning (an unknown axis), which check and build find; and one of syntax,
# which fmt finds too.
BAD = NORM.replace("float32[n, h]\n  }\n  outputs", "float32[n, hh]\n  }\n  outputs")
BROKEN = NORM.replace("axes {", "axes {{")

PASSED = {
    "definition": "rmsnorm_h128",
    "workload": {"uuid": "w0", "axes": {"batch_size": 2}, "inputs": {}},
    "solution": "python_rmsnorm_h128",
    "evaluation": {
        "status": "PASSED",
        "environment": {"hardware": "some-cpu", "libs": {}},
        "timestamp": "2024-01-01T00:00:00",
        "log": "",
        "correctness": {"max_relative_error": 0.0, "max_absolute_error": 0.0},
        "performance": {"latency_ms": 1.0, "reference_latency_ms": 1.0, "speedup_factor": 1.0},
    },
}

SOLUTION = "ds/solutions/me/rmsnorm/rmsnorm_h128/python_rmsnorm_h128"

# (argv, exit code): what a user types wrong, and what the rule says the exit must be.
CASES: list[tuple[list[str], int]] = [
    # the command itself
    ([], USAGE),
    (["biuld", "defs"], USAGE),
    (["--verbose", "check", "defs"], USAGE),
    # build
    (["build"], USAGE),
    (["build", "missing"], INPUT),
    (["build", "afile.txt"], INPUT),
    (["build", "empty"], INPUT),
    (["build", "bad"], INPUT),
    (["build", "ds"], INPUT),
    (["build", "defs", "-o", "afile.txt"], INPUT),
    (["build", "defs", "-o", "afile.txt/sub"], INPUT),
    (["build", "defs", "--package", "bad-name"], USAGE),
    (["build", "defs", "--package", "import"], USAGE),
    (["build", "defs", "--packge", "x"], USAGE),
    # check
    (["check", "missing"], INPUT),
    (["check", "afile.txt"], INPUT),
    (["check", "empty"], INPUT),
    (["check", "bad"], INPUT),
    (["check", "broken"], INPUT),
    (["check", "defs", "--strict"], USAGE),
    # fmt
    (["fmt", "missing"], INPUT),
    (["fmt", "empty"], INPUT),
    (["fmt", "broken"], INPUT),
    (["fmt", "--check", "afile.txt"], INPUT),
    (["fmt", "--chek", "defs"], USAGE),
    # import
    (["import", "missing", "-o", "out"], INPUT),
    (["import", "empty", "-o", "out"], INPUT),
    (["import", "afile.txt", "-o", "out"], INPUT),
    (["import", "ds/definitions", "-o", "afile.txt"], INPUT),
    (["import", "ds/definitions", "-o", "afile.txt/sub"], INPUT),
    (["import", "ds/definitions"], USAGE),
    # list
    (["list", "missing"], INPUT),
    (["list", "empty"], INPUT),
    (["list", "afile.txt"], INPUT),
    (["list", "bad", "--apis"], INPUT),
    (["list", "--apix"], USAGE),
    # workloads
    (["workloads", "rmsnorm_h4069", "-o", "out"], INPUT),
    (["workloads", "rmsnorm/../x", "-o", "out"], USAGE),
    (["workloads", "rmsnorm_h128", "--axes", "batch_size", "-o", "out"], USAGE),
    (["workloads", "rmsnorm_h128", "--axes", "batch_size=-1", "-o", "out"], USAGE),
    (["workloads", "rmsnorm_h128", "--axes", "nope=1", "-o", "out"], INPUT),
    (["workloads", "rmsnorm_h128", "-o", "afile.txt"], INPUT),
    (["workloads", "rmsnorm_h128", "-o", "afile.txt/sub"], INPUT),
    (["workloads", "rmsnorm_h128", "--definitions", "missing", "-o", "out"], INPUT),
    (["workloads", "rmsnorm_h128", "--definitions", "empty", "-o", "out"], INPUT),
    (["workloads", "rmsnorm_h128", "--definitions", "bad", "-o", "out"], INPUT),
    (["workloads", "rmsnorm_h128", "--definitions", "ds", "-o", "out", "--seed", "x"], USAGE),
    # scaffold-solution
    (["scaffold-solution", "rmsnorm_h4069", "--language", "python", "-o", "out"], INPUT),
    (["scaffold-solution", "a/b", "--language", "python", "-o", "out"], USAGE),
    (["scaffold-solution", "rmsnorm_h128", "--language", "rust", "-o", "out"], USAGE),
    (["scaffold-solution", "rmsnorm_h128", "--language", "python", "--author", ".x"], USAGE),
    (["scaffold-solution", "rmsnorm_h128", "--language", "python", "-o", "afile.txt"], INPUT),
    (["scaffold-solution", "rmsnorm_h128", "--language", "python", "-o", "afile.txt/s"], INPUT),
    (["scaffold-solution", "rmsnorm_h128", "--language", "python", "-o", "ds"], INPUT),
    (["scaffold-solution", "norm_h8", "--language", "python", "--definitions", "bad"], INPUT),
    (["scaffold-solution", "norm_h8", "--language", "python", "--definitions", "empty"], INPUT),
    (["scaffold-solution", "norm_h8", "--language", "python", "--definitions", "missing"], INPUT),
    (["scaffold-solution", "rmsnorm_h129", "--language", "python", "--definitions", "ds"], INPUT),
    (["scaffold-solution", "rmsnorm_h128", "--language", "python", "--author", "me", "-o",
      "ds/solutions"], INPUT),  # fmt: skip
    # pack
    (["pack", "missing"], INPUT),
    (["pack", "empty"], INPUT),
    (["pack", "afile.txt"], INPUT),
    (["pack", SOLUTION, "-o", "empty"], INPUT),
    (["pack", SOLUTION, "-o", "afile.txt/x.json"], INPUT),
    (["pack", SOLUTION, "ds", "-o", "x.json"], USAGE),
    (["pack", "--check"], USAGE),
    # bench
    (["bench", "missing"], INPUT),
    (["bench", "afile.txt"], INPUT),
    (["bench", "empty", "--devices", "cpu"], INPUT),
    (["bench", "ds", "--devices", "cpu", "--definitions", "rmsnorm_h4069"], INPUT),
    (["bench", "ds", "--devices", "cpu", "--solutions", "nope"], INPUT),
    (["bench", "ds", "--devices", "gpu"], USAGE),
    (["bench", "ds", "--devices", "cuda:77"], USAGE),
    (["bench", "ds", "--timeout", "-1"], USAGE),
    (["bench", "ds", "--warmup", "many"], USAGE),
    (["bench", "ds", "--repeat", "0"], USAGE),
    (["bench", "ds", "--flush", "cold"], USAGE),
    # report
    (["report", "missing"], INPUT),
    (["report", "afile.txt"], INPUT),
    (["report", "empty"], INPUT),
    (["report", "ds"], INPUT),
    (["report", "traced", "--format", "html"], USAGE),
    (["report", "traced", "--plot", "out.txt"], USAGE),
    (["report", "traced", "--plot", "afile.txt/x.png"], INPUT),
    (["report", "traced", "--plot", "empty"], INPUT),
    # validate
    (["validate", "missing"], INPUT),
    (["validate", "afile.txt"], INPUT),
    (["validate", "empty"], INPUT),
    (["validate", "ds", "--lod"], USAGE),
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """What the commands take and what they must refuse, made once."""
    root = tmp_path_factory.mktemp("workspace")
    (root / "empty").mkdir()
    (root / "afile.txt").write_text("not a folder\n")
    (root / "defs").mkdir()
    (root / "defs" / "norm.fidef").write_text(NORM)
    (root / "bad").mkdir()
    (root / "bad" / "norm.fidef").write_text(BAD)
    (root / "broken").mkdir()
    (root / "broken" / "norm.fidef").write_text(BROKEN)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert main(["workloads", "rmsnorm_h128", "--axes", "batch_size=2", "-o", "ds"]) == 0
        args = ["rmsnorm_h128", "--language", "python", "--author", "me", "-o", "ds/solutions"]
        assert main(["scaffold-solution", *args]) == 0
    finally:
        os.chdir(cwd)
    traces = root / "traced" / "traces" / "rmsnorm"
    traces.mkdir(parents=True)
    (traces / "rmsnorm_h128.jsonl").write_text(json.dumps(PASSED) + "\n")
    return root


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(folder.rglob("*"))
        if "__pycache__" not in p.parts
    }


def _run(
    server: CommandServer, argv: list[str], workspace: Path, scratch: Path
) -> tuple[subprocess.CompletedProcess, bool]:
    """Run one case in its own copy of the workspace; (result, whether the copy is as it was)."""
    here = scratch / f"case{CASES.index((argv, _code(argv)))}"
    shutil.copytree(workspace, here)
    before = _snapshot(here)
    env = {k: v for k, v in os.environ.items() if k != "FIBGEN_DATASET_PATH"}
    env["FIBGEN_CACHE_DIR"] = str(scratch / "cache")
    proc = server.run(argv, here, env)
    return proc, _snapshot(here) == before


@pytest.fixture(scope="module")
def results(workspace, tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, bool]]:
    """Every case's result; two command servers run them, one case each at a time."""
    scratch = tmp_path_factory.mktemp("runs")
    servers: queue.Queue[CommandServer] = queue.Queue()
    for _ in range(2):
        servers.put(CommandServer())

    def one(argv: list[str]) -> tuple[subprocess.CompletedProcess, bool]:
        server = servers.get()
        try:
            return _run(server, argv, workspace, scratch)
        finally:
            servers.put(server)

    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {_id(argv): pool.submit(one, argv) for argv, _ in CASES}
            return {key: future.result() for key, future in futures.items()}
    finally:
        while not servers.empty():
            servers.get().close()


def _code(argv: list[str]) -> int:
    return next(code for case, code in CASES if case == argv)


def _id(argv: list[str]) -> str:
    return " ".join(argv) or "(nothing)"


def test_the_cases_cover_every_command_and_keep_to_the_rule():
    from fibgen.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.choices and "build" in a.choices]
    commands = {argv[0] for argv, _ in CASES if argv and argv[0] in sub.choices}
    assert commands == set(sub.choices), set(sub.choices) - commands
    assert {code for _, code in CASES} == {INPUT, USAGE}


@pytest.mark.slow
@pytest.mark.parametrize("argv, code", CASES, ids=[_id(argv) for argv, _ in CASES])
def test_wrong_input_gets_a_message_and_the_exit_code_of_the_rule(argv, code, results):
    proc, unchanged = results[_id(argv)]
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output
    assert proc.returncode == code, output
    err = proc.stderr
    assert err.startswith(("error: ", "usage: ")), err
    assert "error:" in err and "error: error:" not in err, err
    assert unchanged, f"`fibgen {_id(argv)}` wrote into the workspace"


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv", [["--version"], ["check", "bad"], ["bench", "ds", "--repeat", "0"], ["list", "defs"]]
)
def test_the_command_server_answers_as_a_fresh_process(argv, workspace):
    # What the cases above see through the server is what `python -m fibgen` prints and
    # returns: the same exit code, stdout and stderr, byte for byte.
    env = {k: v for k, v in os.environ.items() if k != "FIBGEN_DATASET_PATH"}
    fresh = subprocess.run(
        [sys.executable, "-m", "fibgen", *argv],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    server = CommandServer()
    try:
        forked = server.run(argv, workspace, env)
    finally:
        server.close()
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )
