"""The runner's side of a worker process: start it on its device, ask it with a timeout, say
why it died, stop or kill it; and kill every worker when a SIGTERM ends the runner."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

from fibgen.bench import child as entry
from fibgen.bench import messages as m
from fibgen.bench.lifetime import START_TIMEOUT, death_of


class Handle:
    """One worker process on one device, started again after it dies or hangs."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.process: Any = None
        self.conn: Any = None
        # Started, and its Started message not read yet.
        self.starting = False
        # Closed by the runner (Ctrl-C): no worker is started again.
        self.closed = False

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        # Started through the light entry module, which ties the worker's life to this
        # process's before it imports torch (Note [worker lifetime] in child.py). Not a
        # daemon: a daemon may not start processes, and the worker starts one per solution
        # (Note [isolated solutions] in isolation.py); the runner stops or kills it.
        process = context.Process(
            target=entry.main, args=(child, self.device, os.getpid()), daemon=False
        )
        try:
            process.start()
        finally:
            child.close()
        self.process, self.conn = process, parent
        self.starting = True

    def ask(self, request: m.Prepare | m.Evaluate, timeout: float) -> m.Reply:
        """Send a request; the reply, or TimedOut, Died, and Stopped once the handle is
        closed."""
        if self.closed:
            return m.Stopped()
        if self.process is None or not self.process.is_alive():
            self.start()
        if self.starting:
            failed = self._await_start()
            if failed is not None:
                return failed
        if self.closed:  # closed while the worker started: it is not used
            self.kill()
            return m.Stopped()
        try:
            self.conn.send(request)
            if not self.conn.poll(timeout):
                self.kill()
                return m.TimedOut()
            return self.conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            why = death_of(self.process)
            self.kill()
            return m.Died(why)

    def _await_start(self) -> m.Died | None:
        """None once the new worker says it started; else Died, the worker killed."""
        self.starting = False
        try:
            if self.conn.poll(START_TIMEOUT) and isinstance(self.conn.recv(), m.Started):
                return None
            why = f"worker process did not start within {START_TIMEOUT:g} s"
        except (EOFError, OSError):
            why = death_of(self.process)
        self.kill()
        return m.Died(why)

    def close(self) -> None:
        """Kill the worker from another thread, and start none again (Note [stopping bench]
        in runner.py): a question in flight is answered Died, later ones Stopped."""
        self.closed = True
        self.signal_kill()

    def signal_kill(self) -> None:
        """SIGKILL the worker and return at once: all a signal handler may do."""
        process = self.process
        if process is not None and process.pid is not None:
            try:
                os.kill(process.pid, signal.SIGKILL)
            except OSError:  # gone already
                pass

    def kill(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.kill()
        if self.process is not None:
            self.process.join(timeout=5)
        if self.conn is not None:
            self.conn.close()
        self.process = self.conn = None

    def stop(self) -> None:
        if self.process is not None and self.process.is_alive():
            try:
                self.conn.send(m.Stop())
                self.process.join(timeout=5)
            except (OSError, BrokenPipeError):
                pass
        self.kill()


@contextlib.contextmanager
def workers_die_on_sigterm(handles: list[Handle]) -> Iterator[None]:
    """While the run lasts, a SIGTERM that would end the runner kills its workers first.

    Only where SIGTERM has its default action (the runner then dies) and only on the main
    thread, where Python runs handlers; elsewhere the workers still die with the runner
    (Note [worker lifetime] in child.py).
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        for handle in list(handles):
            handle.signal_kill()
        # Then die of the signal, as the runner would have without this handler.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def stop_on_sigint(stop: threading.Event, handles: list[Handle]) -> Iterator[None]:
    """While the run lasts, a SIGINT (Ctrl-C) sets ``stop`` and closes every worker, and the
    run ends by itself (Note [stopping bench] in runner.py).

    A handler rather than KeyboardInterrupt: a second SIGINT (``timeout -s INT`` sends one
    to the runner and one to its process group) would otherwise interrupt the stopping
    itself. Only on the main thread, where Python runs handlers.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum: int, frame: Any) -> None:
        stop.set()
        for handle in list(handles):
            handle.close()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
