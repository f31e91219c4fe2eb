"""The messages bench's processes send each other over their pipes.

The runner asks a worker (``Prepare``, ``Evaluate``, ``Stop``) and gets one reply per
question (``Reply``); the worker's handle makes ``TimedOut``, ``Died`` and ``Stopped`` itself
when the worker does not answer. A worker that judges a solution in a process of its own
(Note [isolated solutions] in isolation.py) sends it ``Take``, the ``Run``, ``Verdict`` and
``Draw``. These travel pickled, between processes of bench's own code. What a solution
process sends back does not: it is JSON and raw bytes, checked as it is read
(``isolation._receive``), since a solution may have changed bench's code in its process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fibgen.bench.timing import Flush

# ---------------------------------------------------------------------- runner → worker


@dataclass(frozen=True, slots=True)
class Prepare:
    """Make the workload's inputs on the device, run the reference on them and time it as
    solutions are timed."""

    definition: dict[str, Any]
    workload: dict[str, Any]
    root: str
    hints: dict[str, Any]
    seed: int
    warmup: int
    repeat: int | None
    flush: Flush


@dataclass(frozen=True, slots=True)
class Run:
    """Evaluate a solution on the workload prepared (or taken), then report.

    ``origin``: its JSON's path and whether it is a solution folder, so that logs name the
    user's files (Note [source names] in fibgen/runtime/solutions/loading.py). ``limit_s``
    bounds an isolated solution's process, from its start, and sizes a sampler's draws.
    """

    solution: dict[str, Any]
    tolerance: dict[str, Any]
    warmup: int
    repeat: int | None
    flush: Flush
    limit_s: float
    origin: tuple[str, bool] | None = None


@dataclass(frozen=True, slots=True)
class Evaluate:
    """Load a solution, check it against the prepared reference and time it (``run``), in a
    process of its own when ``isolate`` (Note [isolated solutions] in isolation.py)."""

    run: Run
    isolate: bool = True


@dataclass(frozen=True, slots=True)
class Stop:
    """End the worker."""


# ---------------------------------------------------------------------- worker → runner


@dataclass(frozen=True, slots=True)
class Started:
    """The worker's first message: it runs, and the runner's timeouts count from here."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """The reference's timing figures, the device's name and the library versions."""

    reference: dict[str, Any]
    hardware: str
    libs: dict[str, str]


@dataclass(frozen=True, slots=True)
class Invalid:
    """The dataset's workload cannot be used; one line that names it and the input."""

    why: str


@dataclass(frozen=True, slots=True)
class Failed:
    """The question raised in the worker (or the worker cannot run); its traceback."""

    log: str


@dataclass(frozen=True, slots=True)
class Result:
    """A solution's evaluation fields: status, log, timing, correctness; ``fatal`` when a
    CUDA error broke the worker's context, which then exits."""

    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TimedOut:
    """No reply in time: the worker (or the solution's process) was killed."""


@dataclass(frozen=True, slots=True)
class Died:
    """The worker (or the solution's process) ended without a reply; how."""

    why: str


@dataclass(frozen=True, slots=True)
class Stopped:
    """The run is being stopped: the question was not asked."""


Reply = Prepared | Invalid | Failed | Result | TimedOut | Died | Stopped


def reply_text(reply: Reply) -> str:
    """What a reply that is not the one asked for says, in one line for the runner's log."""
    if isinstance(reply, Invalid):
        return reply.why
    if isinstance(reply, Failed):
        return reply.log
    if isinstance(reply, Died):
        return reply.why
    if isinstance(reply, TimedOut):
        return "timed out"
    if isinstance(reply, Stopped):
        return "stopped"
    return type(reply).__name__


# ------------------------------------------------------- worker → solution process


@dataclass(frozen=True, slots=True)
class Take:
    """The prepared workload: its definition, its inputs lent through shared files, and the
    shapes and dtypes of the reference's outputs."""

    definition: dict[str, Any]
    sent: dict[str, Any]
    expected: list[tuple[list[int], str]]


@dataclass(frozen=True, slots=True)
class Verdict:
    """The judge's check of outputs the solution process sent: the problem (None when they
    passed) and the errors measured."""

    problem: dict[str, Any] | None
    errors: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Draw:
    """Draw a sampler's samples on the workload's rows repeated ``times`` times."""

    times: int
