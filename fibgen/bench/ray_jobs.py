"""The jobs of ``fibgen bench --ray`` on the driver: what each sends (``Shipper``), when a
job is overdue (``deadline``), the workers' slots and the progress line.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fibgen.bench.planning import BenchOptions, Group
from fibgen.bench.progress import ProgressLine
from fibgen.bench.runner import PREPARE_TIMEOUTS, BenchSummary, duration
from fibgen.format.dataset import resolve_dataset_path
from fibgen.format.models.trace import SafetensorsInput
from fibgen.runtime.checking.compare import SAMPLING_TIMEOUT_SCALE, is_sampling

# How often the progress line and the watchdog look, at most, while nothing arrives.
TICK_S = 1.0


@dataclass
class NodeStats:
    """What one node did: its workers, the runs it finished, and for how long it worked."""

    workers: int = 0
    jobs: int = 0
    runs: int = 0
    first: float = math.nan
    last: float = math.nan

    def rate(self, now: float) -> float:
        """Runs per second since the node got its first job."""
        spent = now - self.first
        return self.runs / spent if spent > 0 else 0.0


@dataclass
class RaySummary(BenchSummary):
    """A BenchSummary and what the cluster did: per node; jobs sent again and workers lost;
    seconds until the first worker was ready; each job's seconds on its node; and the
    seconds the driver spent other than waiting (sending, recording, watching)."""

    nodes: dict[str, NodeStats] = field(default_factory=dict)
    retried: int = 0
    lost: int = 0
    startup_s: float = 0.0
    job_s: list[float] = field(default_factory=list)
    driver_s: float = 0.0


@dataclass
class Job:
    group: Group
    # What the worker gets (Shipper.spec), made when the job is first sent.
    spec: dict | None = None
    attempts: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.group.definition.name} workload {self.group.workload.uuid}"

    @property
    def runs(self) -> int:
        return len(self.group.solutions)


class Shipper:
    """Puts what jobs need into the object store, each thing once (Note [node cache])."""

    def __init__(self, ray: Any, root: Path) -> None:
        self.ray = ray
        self.root = root
        self.refs: dict[tuple, Any] = {}

    def _put(self, key: tuple, make: Callable[[], Any]) -> Any:
        if key not in self.refs:
            self.refs[key] = self.ray.put(make())
        return self.refs[key]

    def _blob(self, path: Path) -> tuple[str, Any] | None:
        key = ("blob", path)
        if key not in self.refs:
            try:
                data = path.read_bytes()
            except OSError:
                # Missing or unreadable: not shipped, so the node's worker says the file is
                # not there, as it would on one host.
                return None
            self.refs[key] = (hashlib.sha256(data).hexdigest(), self.ray.put(data))
        return self.refs[key]

    def spec(self, group: Group) -> dict:
        """What a worker gets for a group; its blobs are put into the object store now, so
        that the driver holds only those of the jobs sent so far."""
        definition = group.definition
        blobs: dict[tuple[str, ...], tuple[str, Any]] = {}
        for source in group.workload.inputs.values():
            if not isinstance(source, SafetensorsInput):
                continue
            try:
                path = resolve_dataset_path(self.root, source.path)
            except ValueError:
                continue  # refused by the node's worker with the same message
            shipped = self._blob(path)
            if shipped is not None:
                blobs[path.relative_to(self.root).parts] = shipped
        spec = {
            "definition": self._put(
                ("definition", definition.name), functools.partial(_dumped, definition)
            ),
            "solutions": [
                self._put(("solution", s.name), functools.partial(_dumped, s))
                for s in group.solutions
            ],
            "workload": group.workload.model_dump(mode="json"),
            "tolerance": group.tolerance,
            "hints": group.hints,
            # The driver's paths: the logs a node writes name the files the user edits.
            "origins": group.origins,
            "blobs": [(parts, sha, ref) for parts, (sha, ref) in sorted(blobs.items())],
        }
        return spec


def deadline(job: Job, options: BenchOptions) -> float:
    """Seconds after which a job's worker is taken for stuck: far more than the timeouts of
    its group allow, so that it trips only on a node that stopped answering."""
    definition = job.group.definition
    sampler = is_sampling({"op_type": definition.op_type, "outputs": definition.outputs})
    limit = options.timeout * (SAMPLING_TIMEOUT_SCALE if sampler else 1)
    prepare = options.timeout * PREPARE_TIMEOUTS
    # Each solution may kill the worker, which then prepares the workload again.
    return 2 * (prepare + job.runs * (limit + prepare)) + 600.0


class Slot:
    """One NodeWorker actor, as the driver sees it."""

    def __init__(self, actor: Any, ready_ref: Any) -> None:
        self.actor = actor
        self.ready_ref = ready_ref
        self.node = "?"
        # The jobs sent to it, in the order it runs them: the first is running.
        self.refs: deque[Any] = deque()
        self.head_since = 0.0
        self.kill_reason: str | None = None
        # Set once it is found lost: the job it was running then.
        self.lost_head: Any = None
        self.lost = False


class Progress:
    """One line on stderr: jobs and runs done, failures, retries, runs per second per node."""

    def __init__(self, jobs: list[Job], enabled: bool) -> None:
        self.line = ProgressLine(enabled, tty_interval=TICK_S)
        self.total_jobs = len(jobs)
        self.total_runs = sum(j.runs for j in jobs)
        self.jobs = self.runs = 0

    def show(self, summary: RaySummary, workers: int, final: bool = False) -> None:
        now = self.line.due(final)
        if now is None:
            return
        failed = summary.failed + len(summary.problems)
        nodes = sorted(summary.nodes.items())
        rates = [f"{name} {stats.rate(now):.1f}/s" for name, stats in nodes[:4]]
        if len(nodes) > 4:
            rest = [stats.rate(now) for _, stats in nodes[4:]]
            rates.append(f"{len(rest)} more {min(rest):.1f}-{max(rest):.1f}/s")
        elapsed = now - self.line.start
        left = self.total_runs - self.runs
        eta = elapsed / self.runs * left if self.runs else math.nan
        self.line.show(
            f"bench: jobs {self.jobs}/{self.total_jobs}, runs {self.runs}/{self.total_runs}, "
            f"{failed} failed, {summary.retried} retried; {workers} worker(s) on "
            f"{len(nodes)} node(s): {', '.join(rates) or 'starting'}; ETA {duration(eta)}"
        )

    def close(self) -> None:
        """End the line on a terminal (also when the run is interrupted)."""
        self.line.close()


def _dumped(model: Any) -> dict[str, Any]:
    """A definition's or solution's JSON, as a worker takes it."""
    return model.model_dump(mode="json", exclude_none=True)
