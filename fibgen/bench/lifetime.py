"""The life of bench's processes: each ends with the process that started it, leaves Ctrl-C
to the runner, and starts solution processes from a fork server.

It imports nothing heavy, so that a worker asks to die with its runner before it spends
seconds importing torch (fibgen.bench.worker), a window in which a killed runner would
otherwise leave it running.
"""

from __future__ import annotations

import os
import signal
from typing import Any

# Note [worker lifetime]
# A worker must not outlive its runner: one left running a solution (a hang, a long timing
# loop) holds a CPU or a GPU, and the multiprocessing resource tracker, which exits only when
# every process that holds its pipe has exited, stays with it. A runner that exits normally
# stops its workers, and one stopped by SIGTERM kills them first (worker_handle.py); but a
# runner killed outright (SIGKILL, the OOM killer) can do nothing. So each worker, as it
# starts:
#
# - asks Linux to send it SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG). The
#   "parent" is the runner thread that started the worker; that thread stops its worker
#   before it ends, so the signal comes only when the runner dies;
# - checks that the parent is still the runner, since it may have died before the prctl;
# - runs a thread that watches the parent's pid, for systems without prctl and in case the
#   signal is lost: when the worker is re-parented, it exits.

_PR_SET_PDEATHSIG = 1
_WATCH_PERIOD_S = 0.25


def die_with_parent(parent: int, also: int | None = None, watchdog: bool = True) -> None:
    """Make this process end when process ``parent`` does (Note [worker lifetime]), and
    when process ``also`` does, if given (a grandparent: watched only, no signal comes).
    Without ``watchdog``, only the signal: for a process that forks, which must have no
    other thread."""
    import ctypes
    import signal
    import sys
    import threading
    import time

    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watchdog below still holds
    if os.getppid() != parent:
        os._exit(1)
    if not watchdog:
        return

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:  # there, and not ours to signal
            return False
        return False

    def watch() -> None:
        while os.getppid() == parent and not (also is not None and gone(also)):
            time.sleep(_WATCH_PERIOD_S)
        os._exit(1)

    threading.Thread(target=watch, name="fibgen-parent-watch", daemon=True).start()


def ignore_ctrl_c() -> None:
    """Leave SIGINT to the runner (Note [stopping bench] in runner.py): the first thing a
    process of bench's does, before the seconds it spends importing torch."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def fork_server(device: str) -> Any:
    """The multiprocessing context of the worker's fork server, which starts a process per
    solution (Note [isolated solutions] in isolation.py), started if it is not."""
    import multiprocessing
    from multiprocessing import forkserver

    if device.startswith("cpu"):
        # As setup_device sets it (Note [CPU workers] in device.py), before the server
        # imports Triton, whose interpreter switch is read then.
        os.environ["TRITON_INTERPRET"] = "1"
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["fibgen.bench.fork_server"])
    forkserver.ensure_running()
    return context


# Note [worker start]
# ~~~~~~~~~~~~~~~~~~~
# A new worker imports torch and sets up its device before it can answer: seconds on an idle
# machine, more than a minute on a busy one. That start is not charged to the first request's
# timeout (which is a multiple of --timeout, meant for the work asked): the worker says
# Started (fibgen/bench/messages.py) once started, and the handle waits for that under
# START_TIMEOUT of its own.
START_TIMEOUT = 300.0


def death_of(process: Any) -> str:
    """How a worker or solution process (a multiprocessing Process) ended, in words."""
    process.join(timeout=5)
    code = process.exitcode
    if code is not None and code < 0:
        try:
            return f"worker process killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"worker process killed by signal {-code}"
    return f"worker process exited with status {code}"
