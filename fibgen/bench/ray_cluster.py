"""The cluster side of ``fibgen bench --ray``: importing Ray, connecting, checking the nodes.

Before any work is sent or any file touched, the cluster is checked: its address answers, and
every node runs the driver's Python (major.minor) and fibgen version. Each problem is a
one-line BenchError. Nothing outside the ``ray_*`` modules of the bench imports Ray.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Iterator
from typing import Any

from fibgen.bench import ray_worker
from fibgen.bench.planning import BenchError, DeviceError

RAY_INSTALL = "pip install 'fibgen[ray]'"

# How long the driver waits for every node to say what it runs.
NODE_CHECK_TIMEOUT_S = 60.0


class RayMissing(BenchError):
    """``--ray`` without Ray installed: a command-line mistake, said with how to install it."""


def import_ray() -> Any:
    """The ray module, or RayMissing that says how to install it."""
    try:
        import ray
    except ImportError:
        raise RayMissing(
            f"--ray needs Ray, which is not installed: {RAY_INSTALL} (on the driver and every "
            "node of the cluster)"
        ) from None
    return ray


def device_kind(devices: tuple[str, ...] | None) -> str | None:
    """``cpu`` or ``cuda`` from ``--devices`` under ``--ray``; None to choose by the cluster."""
    if not devices:
        return None
    kinds = {d.strip() for d in devices}
    for kind in ("cpu", "cuda"):
        if kinds == {kind}:
            return kind
    raise DeviceError(
        f"--devices {','.join(devices)}: with --ray, give cpu or cuda; each worker then holds "
        "one CPU or one GPU of the cluster, as many as the cluster has"
    )


def first_line(exc: BaseException, limit: int = 300) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_reachable(address: str) -> None:
    """A one-line BenchError when nothing answers at a ``HOST:PORT`` address."""
    text = address[len("ray://") :] if address.startswith("ray://") else address
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise BenchError(
            f"--ray {address!r} is not an address: give HOST:PORT (the address `ray start "
            "--head` prints), ray://HOST:PORT (a Ray client server), auto (the cluster this "
            "machine is in), or nothing (a local Ray instance)"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise BenchError(
            f"cannot reach a Ray cluster at {address}: {why}; is `ray start --head` running "
            "there, and is the port open to this machine?"
        ) from None


@contextlib.contextmanager
def connected_cluster(ray: Any, address: str | None) -> Iterator[str]:
    """Connect to (or start) Ray for the run; yields how messages name the cluster."""
    if address not in (None, "local", "auto"):
        _check_reachable(address)
    if ray.is_initialized():
        yield address or "this process's Ray connection"
        return
    quiet = {"log_to_driver": False, "logging_level": logging.ERROR}
    # ray.init installs a SIGTERM handler and leaves it after shutdown: a library call gives
    # the process back as it found it.
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        if address in (None, "local"):
            # A worker's output stays in its node's Ray logs: the driver's terminal shows
            # the progress line and the results, as a local run does.
            ray.init(address="local", include_dashboard=False, **quiet)
            where = "a local Ray instance"
        else:
            ray.init(address=address, **quiet)
            where = address
            if not address.startswith("ray://"):
                # `auto` names the cluster it found by its address.
                with contextlib.suppress(Exception):
                    where = ray.get_runtime_context().gcs_address or address
    except Exception as exc:  # ray.init raises ConnectionError, RuntimeError, ValueError...
        if address == "auto":
            hint = "; start one with `ray start --head`, or give its address"
        else:
            # What a refused connection most often is once the port answers.
            hint = (
                "; if the cluster uses token authentication, set RAY_AUTH_MODE=token and give "
                "its token (~/.ray/auth_token or RAY_AUTH_TOKEN)"
            )
        raise BenchError(
            f"cannot connect to Ray at {address or 'local'}: {first_line(exc)}{hint}"
        ) from None
    try:
        yield where
    finally:
        ray.shutdown()
        if threading.current_thread() is threading.main_thread() and sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)


def resources_shown(resources: dict) -> str:
    shown = [f"{int(resources[k])} {k}" for k in ("CPU", "GPU") if resources.get(k)]
    return ", ".join(shown) or "no CPU or GPU"


def mismatch(local: dict, got: dict) -> str | None:
    differ = [
        f"{name} {got[key]} (the driver has {local[key]})"
        for key, name in (("python", "Python"), ("fibgen", "fibgen"))
        if got.get(key) != local.get(key)
    ]
    if not differ:
        return None
    return (
        f"node {got.get('node')} ({got.get('host')}) runs {' and '.join(differ)}: install the "
        "driver's Python and fibgen on every node"
    )


def check_nodes(ray: Any, where: str, local: dict) -> list[str]:
    """Every live node runs the driver's Python and fibgen; notes on nodes that did not say."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(ray_worker.identity)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = {
        probe.options(
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
        ).remote(): n
        for n in nodes
    }
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=NODE_CHECK_TIMEOUT_S)
    for ref in ready:
        node = refs[ref].get("NodeManagerAddress", "?")
        try:
            got = ray.get(ref)
        except ray.exceptions.RayError as exc:
            raise BenchError(
                f"node {node} of the Ray cluster at {where} cannot run fibgen: "
                f"{first_line(exc)}; install fibgen (the driver's version) on every node"
            ) from None
        problem = mismatch(local, got)
        if problem is not None:
            raise BenchError(f"{problem} (Ray cluster at {where})")
    return [
        f"node {refs[ref].get('NodeManagerAddress', '?')} did not say what it runs in "
        f"{NODE_CHECK_TIMEOUT_S:g} s; its workers are checked as they start"
        for ref in pending
    ]
