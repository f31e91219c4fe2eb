"""``fibgen bench --ray``: the local runner's job groups on the GPUs (or CPUs) of a Ray cluster.

The work is the local runner's: ``plan`` groups it by (definition, workload), each group
holding the solutions to run on that workload, and ``--resume`` leaves out what is traced.
Each group is a job for one ``NodeWorker`` actor (ray_worker.py), which holds one GPU
(``num_gpus=1``) or, with ``--devices cpu``, one CPU of the cluster for the whole run, and
runs the group through the local runner's worker process; statuses, logs and timings are
made exactly as on one host. A job is a workload with its solutions, not a solution with its
workloads, for the reason the local runner groups so: the inputs, the reference's outputs
and its timing are made once for every solution that runs on them.

This process, the driver, is the only writer of ``traces/``: a job's traces are appended
with the local runner's ``record_group`` when its reply arrives, so a driver stopped at any
point (Ctrl-C, a kill) leaves whole lines only and ``--resume`` runs the rest. What a job
needs reaches the nodes through Ray's object store (Note [node cache] in ray_worker.py).

Before any work is sent or any file touched, the cluster is checked: its address answers,
it has GPUs when ``--devices cuda`` asks for them, and every node runs the driver's Python
(major.minor) and fibgen version. Each is a one-line BenchError.

Nothing outside the ``ray_*`` modules imports Ray; ``import_ray`` (ray_cluster.py) says how
to install it. ray_jobs.py holds what the driver keeps per job and worker.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fibgen.bench import ray_worker
from fibgen.bench.claims import Claims
from fibgen.bench.planning import BenchError, BenchOptions, DeviceError, plan
from fibgen.bench.ray_cluster import (
    RAY_INSTALL,
    RayMissing,
    check_nodes,
    connected_cluster,
    device_kind,
    first_line,
    import_ray,
    mismatch,
    resources_shown,
)
from fibgen.bench.ray_jobs import (
    TICK_S,
    Job,
    NodeStats,
    Progress,
    RaySummary,
    Shipper,
    Slot,
    deadline,
)
from fibgen.bench.runner import prepare_dataset, record_group
from fibgen.format import FormatError, Trace

__all__ = ["RAY_INSTALL", "RayMissing", "RayOptions", "RaySummary", "run_bench_ray"]

# With work left and no worker running for this long (none could be placed or started),
# the run gives up on the rest.
NO_WORKER_TIMEOUT_S = 600.0

# What the driver compares with each node (ray_worker.identity); a name tests can replace.
local_identity = ray_worker.identity


@dataclass(frozen=True)
class RayOptions:
    """Where and how to run on Ray.

    ``address``: None (or ``"local"``) starts a local Ray instance for the run; ``"auto"``
    joins the cluster this machine belongs to; ``HOST:PORT`` a cluster's GCS address, and
    ``ray://HOST:PORT`` its Ray client server. A process already connected to Ray (its own
    ``ray.init``) keeps that connection. ``retries``: how often a job whose worker was lost
    is sent again. ``workers``: at most this many workers (default: one per GPU, or per
    CPU with ``--devices cpu``, of the cluster).
    """

    address: str | None = None
    retries: int = 2
    workers: int | None = None


class _Driver:
    """Sends jobs to workers as they free up, records replies, replaces lost workers."""

    def __init__(
        self,
        ray: Any,
        root: Path,
        kind: str,
        size: int,
        jobs: list[Job],
        options: BenchOptions,
        ray_options: RayOptions,
        summary: RaySummary,
        local: dict,
        where: str,
        progress: bool,
        on_trace: Callable[[Trace], None] | None,
    ) -> None:
        self.ray = ray
        self.root = root
        self.shipper = Shipper(ray, root)
        self.kind = kind
        self.size = size
        self.queue: deque[Job] = deque(jobs)
        self.options = options
        self.options_ref = ray.put(options)
        self.retries = ray_options.retries
        self.summary = summary
        self.local = local
        self.where = where
        self.on_trace = on_trace
        self.bar = Progress(jobs, progress)
        self.actor_class = ray.remote(ray_worker.NodeWorker)
        self.starting: dict[Any, Slot] = {}
        # Workers that passed the check and run jobs.
        self.ready: list[Slot] = []
        self.inflight: dict[Any, tuple[Slot, Job]] = {}
        self.slots: list[Slot] = []
        self.start_failures = 0
        self.started = time.monotonic()
        self.last_working = time.monotonic()
        # Runs another bench on the dataset claimed are its (Note [bench claims]).
        self.claims = Claims(root)

    # Workers -------------------------------------------------------------------------

    def _start_worker(self) -> None:
        resources = {"num_gpus": 1, "num_cpus": 1} if self.kind == "cuda" else {"num_cpus": 1}
        device = "cuda:0" if self.kind == "cuda" else "cpu"
        actor = self.actor_class.options(max_restarts=0, **resources).remote(device)
        slot = Slot(actor, actor.identity.remote())
        self.starting[slot.ready_ref] = slot
        self.slots.append(slot)

    def _end(self, slot: Slot) -> None:
        with contextlib.suppress(Exception):
            self.ray.kill(slot.actor, no_restart=True)
        for group in (self.slots, self.ready):
            if slot in group:
                group.remove(slot)

    def _replace(self, slot: Slot) -> None:
        self._end(slot)
        # While there is work: on a lost node Ray places the new one elsewhere.
        if (self.queue or self.inflight) and len(self.slots) < self.size:
            self._start_worker()

    def _worker_ready(self, ref: Any) -> None:
        slot = self.starting.pop(ref)
        try:
            got = self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:
            self.start_failures += 1
            why = first_line(exc)
            if self.start_failures > max(3, self.size) * (self.retries + 1):
                self._end(slot)
                raise BenchError(
                    f"workers of the Ray cluster at {self.where} keep failing to start; the "
                    f"last: {why}"
                ) from None
            self.summary.notes.append(f"a worker failed to start and was replaced: {why}")
            self._replace(slot)
            return
        problem = mismatch(self.local, got)
        if problem is not None:
            # A node that joined after the check: nothing more is sent anywhere.
            self._end(slot)
            raise BenchError(f"{problem} (Ray cluster at {self.where})")
        slot.node = got["node"]
        stats = self.summary.nodes.setdefault(slot.node, NodeStats())
        stats.workers += 1
        if not self.summary.startup_s:
            self.summary.startup_s = time.monotonic() - self.started
        self.ready.append(slot)

    # Jobs ------------------------------------------------------------------------------

    def _send(self) -> None:
        # A worker gets a second job while the queue holds at least one per worker: Ray
        # queues it on the actor, which starts it as soon as the first is done instead of
        # waiting for the driver to record the first and send the next. Near the end only
        # one each, so that no worker idles while another holds two.
        for depth in (1, 2):
            for slot in self.ready:
                if not self.queue or (depth == 2 and len(self.queue) < len(self.ready)):
                    return
                if len(slot.refs) >= depth:
                    continue
                job = self.queue.popleft()
                if job.spec is None:
                    if not self._claim(job):
                        continue
                    job.spec = self.shipper.spec(job.group)
                ref = slot.actor.run.remote(job.spec, self.options_ref)
                now = time.monotonic()
                if not slot.refs:
                    slot.head_since = now
                slot.refs.append(ref)
                self.inflight[ref] = (slot, job)
                stats = self.summary.nodes[slot.node]
                if math.isnan(stats.first):
                    stats.first = now

    def _claim(self, job: Job) -> bool:
        """Claim a job's runs before it is first sent; False when another bench claimed all
        of them (Note [bench claims])."""
        group = job.group
        mine, theirs = self.claims.claim(
            group.definition.name, group.workload.uuid, list(group.solutions)
        )
        if not theirs:
            return True
        self.summary.claimed.update(theirs)
        self.bar.runs += sum(theirs.values())
        if not mine:
            self.bar.jobs += 1
            return False
        job.group = replace(group, solutions=tuple(mine))
        return True

    def _finished(self, ref: Any) -> None:
        slot, job = self.inflight.pop(ref)
        try:
            reply = self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:
            self._lost(slot, job, ref, exc)
            return
        slot.refs.remove(ref)
        slot.head_since = time.monotonic()
        node_root = reply["root"]

        def here(text: str) -> str:
            # Messages name the node's copy of the dataset; the person reads this one.
            return text.replace(node_root, str(self.root))

        by_name = {s.name: s for s in job.group.solutions}
        results = []
        for name, evaluation in reply["results"]:
            if "log" in evaluation:
                evaluation = {**evaluation, "log": here(evaluation["log"])}
            results.append((by_name[name], evaluation))
        problem = None if reply["problem"] is None else here(reply["problem"])
        noisy = [here(line) for line in reply["noisy"]]
        record_group(self.root, job.group, results, problem, noisy, self.summary, self.on_trace)
        self.summary.job_s.append(reply["seconds"])
        stats = self.summary.nodes[slot.node]
        stats.jobs += 1
        stats.runs += job.runs
        stats.last = time.monotonic()
        self.bar.jobs += 1
        self.bar.runs += job.runs

    def _lost(self, slot: Slot, job: Job, ref: Any, exc: BaseException) -> None:
        # Note [ray faults]
        # A solution's crash or hang ends only the worker process that the actor started
        # (RUNTIME_ERROR, TIMEOUT: a reply like any other). An error here means the actor
        # itself is gone or failed: its process was killed, its node died or left, or it
        # stopped answering (the watchdog). That is the cluster's failure, not the
        # solution's: the group is sent again, to a new worker that Ray places where there
        # is room, up to --retries times, and then reported as not run. Only the job the
        # actor was running is charged a try; one queued behind it goes back as it was.
        # Traces are written only from the one reply that arrives, so none twice.
        if not slot.lost:
            slot.lost = True
            slot.lost_head = slot.refs[0] if slot.refs else ref
            self.summary.lost += 1
            self._replace(slot)
        if ref is not slot.lost_head:
            self.queue.appendleft(job)
            return
        job.attempts += 1
        job.failures.append(f"node {slot.node}: {slot.kill_reason or first_line(exc)}")
        if job.attempts <= self.retries:
            self.summary.retried += 1
            self.queue.appendleft(job)
            return
        self.summary.problems.append(
            f"{job.where}: its worker was lost {job.attempts} time(s) "
            f"({'; '.join(job.failures)}); not run: {job.runs} run(s) (--retries "
            f"{self.retries})"
        )
        self.bar.jobs += 1
        self.bar.runs += job.runs

    def _watch(self) -> None:
        now = time.monotonic()
        for slot in self.ready:
            if not slot.refs or slot.kill_reason is not None:
                continue
            _, job = self.inflight[slot.refs[0]]
            limit = deadline(job, self.options)
            if now - slot.head_since > limit:
                slot.kill_reason = f"no reply in {limit:.0f} s"
                with contextlib.suppress(Exception):
                    self.ray.kill(slot.actor, no_restart=True)
        if self.inflight or self.ready or not self.queue:
            self.last_working = now
        elif now - self.last_working > NO_WORKER_TIMEOUT_S:
            runs = sum(j.runs for j in self.queue)
            resources = resources_shown(self.ray.available_resources())
            self.summary.problems.append(
                f"not run: {runs} run(s) of {len(self.queue)} workload(s): no worker of the Ray "
                f"cluster at {self.where} could start in {NO_WORKER_TIMEOUT_S:g} s (free now: "
                f"{resources})"
            )
            self.queue.clear()

    # The run ---------------------------------------------------------------------------

    def run(self) -> None:
        for _ in range(self.size):
            self._start_worker()
        while self.queue or self.inflight:
            busy = time.perf_counter()
            self._send()
            refs = [*self.inflight, *self.starting]
            if not refs:
                # Work is queued but no worker is running or starting (every start failed
                # and was not replaced): start one.
                self._start_worker()
                continue
            self.summary.driver_s += time.perf_counter() - busy
            done, _ = self.ray.wait(refs, num_returns=1, timeout=TICK_S)
            busy = time.perf_counter()
            if done:
                done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in done:
                if ref in self.starting:
                    self._worker_ready(ref)
                else:
                    self._finished(ref)
            self._watch()
            self.bar.show(self.summary, len(self.slots))
            self.summary.driver_s += time.perf_counter() - busy
        self.bar.show(self.summary, len(self.slots), final=True)

    def close(self, graceful: bool) -> None:
        """End every worker: told to stop its worker process first when ``graceful``."""
        if graceful and self.ready:
            stops = [slot.actor.stop.remote() for slot in self.ready]
            with contextlib.suppress(Exception):
                self.ray.wait(stops, num_returns=len(stops), timeout=10)
        for slot in list(self.slots):
            # Killing the actor kills its worker process too (Note [worker lifetime]).
            self._end(slot)
        self.bar.close()


def _node_notes(summary: RaySummary, where: str, now: float) -> list[str]:
    nodes = ", ".join(
        f"{name} ({stats.workers} worker(s), {stats.runs} run(s), {stats.rate(now):.2f}/s)"
        for name, stats in sorted(summary.nodes.items())
    )
    notes = [f"ran on {len(summary.nodes)} node(s) of {where}: {nodes or 'none'}"]
    if summary.retried:
        notes.append(
            f"sent {summary.retried} job(s) again after their worker was lost ({summary.lost} "
            "worker(s) lost in all)"
        )
    return notes


def run_bench_ray(
    root: str | Path,
    options: BenchOptions = BenchOptions(),
    ray_options: RayOptions = RayOptions(),
    *,
    progress: bool = True,
    on_trace: Callable[[Trace], None] | None = None,
) -> RaySummary:
    """``run_bench`` on a Ray cluster: the same plan, traces and summary (see the module)."""
    root = Path(root)
    if ray_options.retries < 0:
        raise BenchError("--retries must be 0 or more")
    kind = device_kind(options.devices)
    ray = import_ray()

    def planned(kind: str) -> Any:
        try:
            return plan(root, replace(options, devices=(kind,)))
        except FormatError as exc:
            raise BenchError(str(exc)) from None

    # A wrong filter or an empty dataset is said before a cluster is started or joined.
    work_plan = planned(kind or "cpu")
    with connected_cluster(ray, ray_options.address) as where:
        resources = ray.cluster_resources()
        if kind is None:
            kind = "cuda" if resources.get("GPU", 0) >= 1 else "cpu"
            work_plan = planned(kind)
        have = int(resources.get("GPU" if kind == "cuda" else "CPU", 0))
        if have < 1:
            unit = "GPU" if kind == "cuda" else "CPU"
            raise DeviceError(
                f"--devices {kind}: the Ray cluster at {where} has no {unit} "
                f"({resources_shown(resources)}); "
                + (
                    "use --devices cpu, or add GPU nodes"
                    if kind == "cuda"
                    else "add nodes with CPUs"
                )
            )
        summary = RaySummary(skipped=work_plan.skipped, notes=list(work_plan.notes))
        summary.notes += check_nodes(ray, where, local_identity())
        # The cluster is fit: only now is anything in the dataset written.
        prepare_dataset(root, work_plan, summary)
        if not work_plan.groups:
            return summary
        jobs = [Job(group) for group in work_plan.groups]
        size = min(have, len(jobs), ray_options.workers or have)
        driver = _Driver(
            ray,
            root,
            kind,
            size,
            jobs,
            options,
            ray_options,
            summary,
            local_identity(),
            where,
            progress,
            on_trace,
        )
        graceful = False
        try:
            driver.run()
            graceful = True
        finally:
            # Ctrl-C or an error: outstanding jobs are dropped with their workers; every
            # trace line written so far is whole (appends replace the file atomically).
            driver.close(graceful)
            driver.claims.release()
        summary.notes += _node_notes(summary, where, time.monotonic())
        return summary
