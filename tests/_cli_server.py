"""`python -m fibgen ARGS`, run many times at the cost of one interpreter start.

Note [the command server]
A test that runs the `fibgen` command a hundred times (every command with every kind of wrong
input) spent most of its time starting Python and importing fibgen and torch, about a second
of CPU each. A server process imports them once and forks a child per command; the child changes
to the command's folder and environment, points its stdout and stderr at files, and runs
`fibgen/__main__.py` as `python -m fibgen` does (`runpy`, `sys.argv`, `SystemExit`), printing
the traceback Python would print for an exception that escapes. What a fresh process would
show differently is only what those imports themselves do (none reads the environment or
the folder); the tests that hold argument errors
to not importing torch start real processes (tests/test_cli.py).

Forking after torch's import is safe because the server runs no torch operation: no thread
pool has been started. The server is not multiprocessing's forkserver, which bench uses with
its own preloaded modules.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

_SERVER = r"""
import json, os, runpy, sys, traceback

# What the commands import, once: torch, and fibgen's compiler, formats and CLI. None reads
# the environment or the folder when imported, and no torch operation runs here.
import torch  # noqa: F401
import fibgen.cli  # noqa: F401
import fibgen.compiler.ir  # noqa: F401
import fibgen.format.dataset  # noqa: F401


def child(request):
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        os.dup2(os.open(request["stdout"], flags, 0o644), 1)
        os.dup2(os.open(request["stderr"], flags, 0o644), 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        sys.stdin = open(0, closefd=False)
        sys.argv = ["fibgen", *request["argv"]]
        try:
            runpy.run_module("fibgen", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(request)
    _, status = os.waitpid(pid, 0)
    sys.stdout.write(json.dumps({"code": os.waitstatus_to_exitcode(status)}) + "\n")
    sys.stdout.flush()
"""


class CommandServer:
    """One server process; ``run`` is one command at a time (a lock guards the pipe)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self._scratch = Path(tempfile.mkdtemp(prefix="fibgen-cli-"))
        self._count = 0

    def _server(self) -> subprocess.Popen[str]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _SERVER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        return self._proc

    def run(
        self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        """What ``subprocess.run([python, "-m", "fibgen", *argv], cwd=cwd, env=env,
        capture_output=True, text=True, timeout=timeout)`` returns."""
        with self._lock:
            self._count += 1
            out = self._scratch / f"{self._count}.out"
            err = self._scratch / f"{self._count}.err"
            request = {"argv": argv, "cwd": str(cwd), "env": env}
            request |= {"stdout": str(out), "stderr": str(err)}
            server = self._server()
            assert server.stdin is not None and server.stdout is not None
            server.stdin.write(json.dumps(request) + "\n")
            server.stdin.flush()
            ready, _, _ = select.select([server.stdout], [], [], timeout)
            if not ready:
                self.close()
                raise subprocess.TimeoutExpired(["fibgen", *argv], timeout)
            line = server.stdout.readline()
            if not line:
                raise RuntimeError(f"the command server died running `fibgen {' '.join(argv)}`")
            code = json.loads(line)["code"]
            stdout = out.read_text(encoding="utf-8", errors="replace")
            stderr = err.read_text(encoding="utf-8", errors="replace")
            out.unlink()
            err.unlink()
        return subprocess.CompletedProcess(["fibgen", *argv], code, stdout, stderr)

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None
