"""Writes that are cut short leave nothing behind, and written files get the umask's mode.

A build killed between creating a temp file and renaming it leaves `.<name>.<random>.tmp`
beside its target: the next build removes it and `build --check` reports it. A build that
fails with an exception removes its temp file at once. Files written by build, fmt, import
and workloads get 0666 less the umask (a rewritten file keeps its mode), not the 0600 of a
fresh temp file.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from fibgen.cli import main
from fibgen.fsutil import replace_atomically, stale_temp_files, temp_target

REPO = Path(__file__).resolve().parents[1]

# Builds `src` into `out`, and SIGKILLs itself at the n-th rename of a temp file over its
# target (0: at the manifest's, the last): the temp file of that write is complete and never
# renamed, as when a build is killed mid-write.
KILLED_BUILD = """
import os, signal, sys
import fibgen.fsutil
from fibgen.cli import main

n = int(sys.argv[3])
real_replace = os.replace
count = 0

def replace(src, dst):
    global count
    count += 1
    if count == n or (n == 0 and str(dst).endswith(".fibgen-manifest")):
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(src, dst)

fibgen.fsutil.os.replace = replace
main(["build", sys.argv[1], "-o", sys.argv[2]])
"""


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _temps(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.tmp"))


@pytest.fixture
def source(tmp_path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "norm.fidef").write_text((REPO / "definitions/norm.fidef").read_text())
    return src


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", [1, 30, 0])
def test_a_build_killed_mid_write_is_cleaned_by_the_next(tmp_path, source, kill_at):
    out = tmp_path / "out"
    env = {**os.environ, "FIBGEN_CACHE_DIR": ""}  # no black cache writes among the renames
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_BUILD, str(source), str(out), str(kill_at)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == -9, proc.stderr
    left = _temps(out)
    assert len(left) == 1  # the write that was cut short
    code, stdout, stderr = _run(["build", str(source), "-o", str(out), "--check"])
    assert code == 1
    rel = left[0].relative_to(out).as_posix()
    assert f"--- a/{rel}\n+++ /dev/null\n(temp file of an interrupted build)\n" in stdout
    assert "is stale" in stderr
    code, stdout, _ = _run(["build", str(source), "-o", str(out)])
    assert code == 0
    assert _temps(out) == []
    assert _run(["build", str(source), "-o", str(out), "--check"])[0] == 0


def test_an_exception_mid_write_leaves_no_temp_file(tmp_path, source, monkeypatch):
    out = tmp_path / "out"
    calls = []
    real = os.replace

    def failing(src, dst):
        calls.append(dst)
        if len(calls) == 10:
            raise OSError(28, "No space left on device")
        real(src, dst)

    monkeypatch.setattr("fibgen.fsutil.os.replace", failing)
    code, _, stderr = _run(["build", str(source), "-o", str(out)])
    assert code == 1
    assert stderr.startswith(f"error: cannot write into {out}: No space left on device"), stderr
    assert _temps(out) == []


def test_only_our_own_temp_files_are_removed(tmp_path, source):
    out = tmp_path / "out"
    assert _run(["build", str(source), "-o", str(out)])[0] == 0
    ours = out / "definitions/rmsnorm/.rmsnorm_h128.json.k2j4_x9q.tmp"
    manifest_temp = out / "..fibgen-manifest.0000abcd.tmp"
    theirs = [out / "definitions/rmsnorm/.notes.txt.abcdefgh.tmp", out / "definitions/x.tmp"]
    for p in [ours, manifest_temp, *theirs]:
        p.write_text("partial")
    assert stale_temp_files(ours.parent, {"rmsnorm_h128.json"}) == [ours]
    assert temp_target(ours.name) == "rmsnorm_h128.json"
    code, stdout, _ = _run(["build", str(source), "-o", str(out)])
    assert code == 0 and "2 removed" in stdout
    assert not ours.exists() and not manifest_temp.exists()
    assert all(p.exists() for p in theirs)


@pytest.fixture
def umask():
    """Set the umask for one test, then put the old one back."""
    old = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def _modes(folder: Path) -> set[int]:
    return {p.stat().st_mode & 0o777 for p in folder.rglob("*") if p.is_file()}


def test_build_writes_files_with_the_umasks_mode(tmp_path, source, umask):
    umask(0o022)
    assert _run(["build", str(source), "-o", str(tmp_path / "a")])[0] == 0
    assert _modes(tmp_path / "a") == {0o644}
    umask(0o027)
    assert _run(["build", str(source), "-o", str(tmp_path / "b")])[0] == 0
    assert _modes(tmp_path / "b") == {0o640}


def test_a_rewritten_file_keeps_its_mode(tmp_path, umask):
    umask(0o022)
    target = tmp_path / "f.fidef"
    target.write_text("family f { op_type f }\n")
    target.chmod(0o600)
    assert _run(["fmt", str(target)])[0] == 0
    assert target.read_text() == "family f {\n  op_type f\n}\n"
    assert target.stat().st_mode & 0o777 == 0o600
    executable = tmp_path / "tool"
    executable.write_text("old")
    executable.chmod(0o4755)  # setuid is not carried over to new content
    replace_atomically(executable, b"new")
    assert executable.stat().st_mode & 0o7777 == 0o755


@pytest.mark.slow
def test_import_and_workloads_write_with_the_umasks_mode(tmp_path, umask):
    umask(0o022)
    defn = REPO / "generated/definitions/rmsnorm/rmsnorm_h128.json"
    assert _run(["import", str(defn), "-o", str(tmp_path / "fidef")])[0] == 0
    assert _modes(tmp_path / "fidef") == {0o644}
    dataset = tmp_path / "dataset"
    argv = ["workloads", "rmsnorm_h128", "--axes", "batch_size=1,2", "-o", str(dataset)]
    code, _, stderr = _run(argv + ["--definitions", str(REPO / "definitions")])
    assert code == 0, stderr
    assert _modes(dataset) == {0o644}
    assert json.loads((dataset / "definitions/rmsnorm/rmsnorm_h128.json").read_text())
