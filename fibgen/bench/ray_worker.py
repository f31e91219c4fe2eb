"""What runs on a Ray node for ``fibgen bench --ray``: one worker per GPU (or CPU).

A ``NodeWorker`` is a Ray actor that holds one device for the whole run. It runs the local
runner's job groups (one workload of a definition, every solution to run on it) through the
local runner's own machinery: a worker process started with multiprocessing, tied to the
actor's life (Note [worker lifetime] in child.py), asked and timed by ``run_group``. So a
solution that aborts or hangs kills or stalls only that process, and is RUNTIME_ERROR or
TIMEOUT exactly as on one host; the actor answers for the group. Only the loss of the actor
itself (its process killed, its node gone) is an infrastructure failure, which the driver
retries (Note [ray faults] in ray_runner.py).

Nothing is assumed shared with the driver. What a group needs comes through Ray: the
definition and solutions as object references (fetched once per node by Ray's object store),
the workload line, its tolerance and generation hints, and the blob files its inputs read.
Blobs are kept on the node under their content hash (Note [node cache]); solutions are built
under ``FIBGEN_CACHE_DIR``, node-local unless the node's environment sets it, so a solution
built on a node is reused there.

This module imports no Ray and nothing heavy at import time: the driver pickles
``NodeWorker`` and ``identity`` by reference, and a node that lacks fibgen says so when they
are unpickled there.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

# Note [node cache]
# A node keeps what the runs shipped to it under one folder (node_cache_dir, which
# FIBGEN_RAY_CACHE sets where /tmp is small):
#
#   blobs/<sha256>        a blob file's bytes, fetched from the object store once per node;
#   roots/<key>/...       a dataset root holding a set of blobs at their dataset paths
#                         (hard links into blobs/), key = hash of the (path, sha256) pairs;
#   build/                FIBGEN_CACHE_DIR, unless the node's environment sets one.
#
# Everything is written to a temporary name and renamed into place, so that the workers of
# one node, which share the folder, never see half a file, and the first to finish wins.
# Keys are content hashes, so nothing there is ever stale; nothing is removed either
# (delete the folder between runs to reclaim the space).


def node_cache_dir() -> Path:
    """Where a node keeps blobs, dataset roots and builds (Note [node cache]):
    ``$FIBGEN_RAY_CACHE`` in the environment ``ray start`` ran in, else a folder in /tmp."""
    given = os.environ.get("FIBGEN_RAY_CACHE")
    return Path(given) if given else Path(tempfile.gettempdir()) / f"fibgen-ray-{os.getuid()}"


def identity() -> dict[str, str]:
    """What a node runs, compared with the driver's before any work is sent to it."""
    import platform
    import socket
    from importlib import metadata

    try:
        version = metadata.version("fibgen")
    except metadata.PackageNotFoundError:
        # On sys.path without being installed (a checkout): still a fibgen, of no version.
        version = "unknown"
    try:
        import ray

        node = ray.util.get_node_ip_address()
    except Exception:  # only a label for messages
        node = socket.gethostname()
    python = ".".join(platform.python_version_tuple()[:2])
    return {"python": python, "fibgen": version, "node": node, "host": socket.gethostname()}


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class NodeWorker:
    """A Ray actor that runs job groups on one device of its node (see the module's doc)."""

    def __init__(self, device: str) -> None:
        self.cache = node_cache_dir()
        for sub in ("blobs", "roots", "build"):
            (self.cache / sub).mkdir(parents=True, exist_ok=True)
        # The worker process inherits this environment: its builds stay on this node.
        os.environ.setdefault("FIBGEN_CACHE_DIR", str(self.cache / "build"))
        self.empty_root = self.cache / "roots" / "empty"
        self.empty_root.mkdir(exist_ok=True)
        # Definitions and solutions arrive as object references; each is read once.
        self.objects: dict[str, Any] = {}
        from fibgen.bench.worker_handle import Handle

        # Ray sets CUDA_VISIBLE_DEVICES to this actor's GPU: to the worker it is cuda:0.
        self.handle = Handle(device)
        # Started now, so that it imports torch while the driver checks this actor.
        self.handle.start()

    def identity(self) -> dict[str, str]:
        """See ``identity``; the driver checks it before sending work."""
        return identity()

    def _get(self, ref: Any, model: Any) -> Any:
        """The object behind ``ref`` as a ``model``, fetched and validated once per worker."""
        import ray

        key = ref.hex()
        if key not in self.objects:
            if len(self.objects) > 1024:
                self.objects.clear()
            self.objects[key] = model.model_validate(ray.get(ref))
        return self.objects[key]

    def _blob(self, sha: str, ref: Any) -> Path:
        path = self.cache / "blobs" / sha
        if not path.is_file():
            import ray

            data = ray.get(ref)
            if hashlib.sha256(data).hexdigest() != sha:
                raise OSError(f"blob {sha} arrived damaged")
            _write_atomic(path, data)
        return path

    def _root(self, blobs: list[tuple[tuple[str, ...], str, Any]]) -> Path:
        """A dataset root holding these blobs at their dataset paths (Note [node cache])."""
        if not blobs:
            return self.empty_root
        key = hashlib.sha256(
            repr(sorted((parts, sha) for parts, sha, _ in blobs)).encode()
        ).hexdigest()[:32]
        root = self.cache / "roots" / key
        if root.is_dir():
            return root
        tmp = self.cache / "roots" / f".{key}.{uuid.uuid4().hex}"
        for parts, sha, ref in blobs:
            source = self._blob(sha, ref)
            target = tmp.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, target)
            except OSError:  # a file system without hard links
                shutil.copyfile(source, target)
        try:
            os.rename(tmp, root)
        except OSError:  # another worker of this node made it first
            shutil.rmtree(tmp, ignore_errors=True)
        return root

    def run(self, job: dict, options: Any) -> dict:
        """Run one job group; its results, with the node root its messages may name."""
        from fibgen.bench.planning import Group
        from fibgen.bench.runner import run_group
        from fibgen.format import Definition, Solution, Workload

        started = time.perf_counter()
        root = self._root(job["blobs"])
        group = Group(
            self._get(job["definition"], Definition),
            Workload.model_validate(job["workload"]),
            tuple(self._get(ref, Solution) for ref in job["solutions"]),
            job["tolerance"],
            job["hints"],
            tuple(tuple(o) for o in job.get("origins", ())),
        )
        results, problem, noisy = run_group(self.handle, group, root, options)
        return {
            "results": [(solution.name, evaluation) for solution, evaluation in results],
            "problem": problem,
            "noisy": noisy,
            "root": str(root),
            "seconds": time.perf_counter() - started,
        }

    def stop(self) -> None:
        """Stop the worker process; the driver then ends the actor."""
        self.handle.stop()
