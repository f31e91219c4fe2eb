"""The entry point of a benchmark worker process: tie its life to the runner's, then work.

Until it has asked to die with its runner (fibgen/bench/lifetime.py) it imports nothing
heavy; then it imports the worker and hands it the way to start a solution's own process.
"""

from __future__ import annotations

from typing import Any

from fibgen.bench.lifetime import die_with_parent, fork_server, ignore_ctrl_c


def main(conn: Any, device: str, parent: int) -> None:
    """Run a benchmark worker that ends when process ``parent`` (the runner) does."""
    ignore_ctrl_c()
    die_with_parent(parent)
    # The fork server imports torch while this process does: where cores are free, its
    # start costs no time of its own.
    fork_server(device)
    from fibgen.bench import isolation, worker

    worker.main(conn, device, isolation.SolutionProcess)
