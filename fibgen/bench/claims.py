"""Benches that share a dataset share its work: each claims a run before it runs it.

Note [bench claims]
~~~~~~~~~~~~~~~~~~~
Two benches started on one dataset each ran everything (90 duplicate traces of 180). Now a
bench registers itself in ``<dataset>/.fibgen/bench/``: a file ``runs/<id>.json`` saying who
it is (pid, host, start), which it holds locked (``flock``) for as long as it runs, and, before
it runs a workload's solutions, a claim ``claims/<hash>`` per (definition, workload, solution)
naming its id. A run that another live bench has claimed is skipped and said
(``BenchSummary.claimed``): that bench writes its trace. Whether a bench still lives is asked
of the kernel, not of a pid that may be reused: its run file's lock is released when its
process ends, however it ends, so a claim of a bench that was killed is stale and taken
over. A process the bench forked holds that lock too and may outlive it, so on the bench's own
host a run whose pid is gone is stale as well (a pid reused by another process still has the
lock free to say so). Claims and the run file are removed when the bench ends. Claims are made under a lock
of their own (in fibgen's cache, keyed by the claims folder's real path, so benches on one
machine share it), so two benches never claim one run both. The folder starts with a dot: no
reader of the dataset (fibgen's or flashinfer-bench's) takes it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from fibgen.format.dataset import inside_dataset
from fibgen.fsutil import lock_path


def _key(definition: str, workload: str, solution: str) -> str:
    return hashlib.sha256(f"{definition}\0{workload}\0{solution}".encode()).hexdigest()[:40]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Claims:
    """This bench's registration in a dataset and the runs it claimed (Note [bench claims])."""

    def __init__(self, root: Path) -> None:
        self.root = root
        base = root / ".fibgen" / "bench"
        self.runs = inside_dataset(root, base / "runs")
        self.claims = inside_dataset(root, base / "claims")
        self.runs.mkdir(parents=True, exist_ok=True)
        self.claims.mkdir(parents=True, exist_ok=True)
        self.id = uuid.uuid4().hex
        self.mine: list[Path] = []
        started = time.strftime("%H:%M:%S", time.localtime())
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": started}
        self.run_file = inside_dataset(root, self.runs / f"{self.id}.json", file=True)
        self.run_file.write_text(json.dumps(me) + "\n", encoding="utf-8")
        # Held for the life of this bench: the kernel lets go of it when the process ends.
        self.fd = os.open(self.run_file, os.O_RDONLY)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        # Out of the dataset, keyed by its real path (Note [lock files] in fsutil.py).
        self.lock_path = lock_path(self.claims)

    def _lock(self) -> Any:
        from filelock import FileLock

        return FileLock(str(self.lock_path))

    def _owner(self, run_id: str) -> str | None:
        """Who run ``run_id`` is, if it still runs (its run file locked); else None."""
        path = self.runs / f"{run_id}.json"
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                who = json.loads(path.read_text(encoding="utf-8"))
                if who["host"] == socket.gethostname() and not _alive(int(who["pid"])):
                    # Its lock outlives it in a process it forked (a Ray or solution
                    # process); the bench itself was killed.
                    return None
                return f"pid {who['pid']} on {who['host']}, started {who['started']}"
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None  # its bench ended without removing it: killed
        except (OSError, ValueError, KeyError, TypeError):
            return None
        finally:
            os.close(fd)

    def claim(self, definition: str, workload: str, solutions: list[Any]) -> tuple[list, Counter]:
        """Claim the runs of one workload: (the solutions this bench is to run, the runs
        another live bench claimed, counted by who it is)."""
        mine: list = []
        theirs: Counter = Counter()
        owners: dict[str, str | None] = {}
        with self._lock():
            for solution in solutions:
                path = self.claims / _key(definition, workload, solution.name)
                try:
                    holder = path.read_text(encoding="utf-8").strip()
                except FileNotFoundError:
                    holder = ""
                if holder and holder != self.id:
                    if holder not in owners:
                        owners[holder] = self._owner(holder)
                    if owners[holder] is not None:
                        theirs[owners[holder]] += 1
                        continue
                path.write_text(self.id + "\n", encoding="utf-8")
                self.mine.append(path)
                mine.append(solution)
        return mine, theirs

    def release(self) -> None:
        """Remove this bench's claims and its registration."""
        with self._lock():
            for path in self.mine:
                try:
                    if path.read_text(encoding="utf-8").strip() == self.id:
                        path.unlink()
                except OSError:
                    pass
            self.mine = []
            try:
                self.run_file.unlink()
            except OSError:
                pass
        os.close(self.fd)
