"""Tracing: record the workloads of live calls as a FlashInfer Trace dataset.

``enable_tracing(dataset_dir)`` makes every generated dispatcher record the calls it sees:
the var-axis values and, per the dump policy, copies of the input tensors. Records become
workload lines in ``workloads/<op_type>/<definition>.jsonl`` and safetensors blobs in
``blob/workloads/<op_type>/<definition>/``, written by a background thread.
``FIBGEN_TRACE=1`` with ``FIBGEN_DATASET_PATH=<dir>`` enables it when ``fibgen.runtime`` is
imported (``FIBGEN_TRACE_DUMP`` and ``FIBGEN_TRACE_DEDUP`` choose the policies).

This module turns tracing on and off and hooks it into the dispatchers' routes; one
``_Tracer`` per enable_tracing holds the parts. ``policies`` (what is kept), ``records``
(``Recorder``: a call recorded on its thread into the ``Pending`` queue, under a
``RecordPolicy``; ``Counts``: what tracing_stats() says, and the warnings given once),
``checks`` (whether a call is a workload of its definition) and ``writer`` (``Writer``: the
thread that writes the files).

Note [complete datasets]
A traced dataset is one ``fibgen bench`` and flashinfer-bench can load: beside the first
workloads of a definition the writer puts its definition JSON and ``.fibgen`` sidecar
(found beside the dispatcher that made the call: ``<out>/definitions/`` of ``fibgen build
-o <out>``, or fibgen's built-in catalogue for ``fibgen_kernels``), unless the dataset has
that definition already. Only definitions that exist are recorded: a call whose const values
no instance declares (``rmsnorm`` at a hidden size of 1234) names a definition that has no
JSON, contract or reference, so it is not recorded; such calls are counted
(``tracing_stats()["unknown"]``) and the first one is reported.

Note [tracing hooks]
Tracing costs nothing while it is off because it lives on the dispatcher's slow path. When it
turns on, ``set_tracer`` clears every dispatcher's routes and ``direct`` hook, so each
call goes through ``_api.resolve`` once per key, and ``resolve`` hands every new route to
``_wrap`` below. The wrapped route records, then calls what the route called before:

- an ``ORIGINAL`` route gets the API's own arguments; the generated ``_inputs`` function maps
  them to the definition's inputs (plan-time ones included);
- ``RETURNS``, ``DPS`` and ``INPLACE`` routes get the definition's inputs by keyword (and the
  output buffers, which the generated ``_var_axes`` ignores).

The generated ``_var_axes`` reads each var axis from the shape of an input that carries it
(or from the integer scalar input of its name, Note [axes bound by a scalar] in ir.py),
as decided at generation time. Turning tracing off restores the routes and hooks.

Note [missed calls]
Tracing says what it did not record. Every call that reaches a dispatcher while tracing is
on is recorded, filtered out by the dedup policy, or counted in ``tracing_stats()`` under
the reason it was not recorded, and the first call of each reason warns once, saying how to
get such calls recorded:

- ``unknown``: its const values name no definition of the family (or none at all);
- ``mismatched``: its inputs are not its definition's (Note [checked records]); with apply
  on, the dispatcher's own check of its tensors refuses such a call before tracing sees it,
  and it is counted here all the same;
- ``unplanned``: a ``run()`` of a wrapper whose ``plan()`` tracing did not see: planned
  before tracing was turned on (turning tracing or apply on or off forgets every plan,
  Note [plan state] in patching.py); its plan-time inputs are unknown;
- ``plan_changed``: a ``run()`` after the wrapper's plan state changed behind fibgen's back
  (a ``plan()`` through a method bound before, or ``forward()``);
- ``refused``: with apply on, a call that fails a rule of its definition (another ``eps``)
  and goes to the original API: it is not a workload of that definition;
- ``capturing``: a call made while a CUDA graph is captured, with tensors to dump, whose
  copy would be captured into the graph; with apply on, a call of a solution's name first
  made in capture, whose route is decided only after it (routing.api.Api.resolve); a
  hand-written call in capture with a scalar given as a CUDA tensor (each said once apart:
  their remedies differ);
- ``handwritten``: a call of hand-written code routed by name (``apply``) that cannot be
  recorded: no definition of the name is found, or its arguments are not the definition's
  inputs (Note [recorded hand-written calls] in handwritten.py; such calls are recorded
  otherwise);
- ``dropped`` and ``failed``: records the writer could not keep up with, or not write.

Not a miss, and counted apart: ``inner``, a call of a definition made inside a recorded
hand-written call of the same definition, which that record stands for.

The calls of the first four, and calls first made in capture with apply on, never reach a
route that ``_wrap`` wraps (a miss, a refusal, a route of a name that is no definition, a
route not kept): the dispatcher's ``miss``, ``refuse`` and ``resolve`` tell tracing of them
through ``set_tracer``'s ``missed``, as hand-written routing tells it of the calls its input
check refuses.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fibgen.runtime.env import enable_from_env
from fibgen.runtime.routing.api import Api
from fibgen.runtime.routing.apply import set_tracer
from fibgen.runtime.routing.state import ORIGINAL
from fibgen.runtime.solutions import loading as solutions
from fibgen.runtime.tracing.checks import definition_file, input_check
from fibgen.runtime.tracing.handwritten import CaptureRead, Target, target_of
from fibgen.runtime.tracing.policies import (
    DedupPolicy,
    DumpByName,
    DumpPolicy,
    TracingConfigError,
    dedup_rule,
    dump_rule_of,
    parse_dedup,
    parse_dump,
)
from fibgen.runtime.tracing.records import (
    Counts,
    Pending,
    Recorder,
    RecordPolicy,
    mismatch_message,
)
from fibgen.runtime.tracing.writer import Writer

__all__ = [
    "TracingConfigError",
    "disable_tracing",
    "enable_tracing",
    "flush_tracing",
    "is_tracing",
    "tracing_stats",
]

DEFAULT_MAX_PENDING_BYTES = 256 << 20
DEFAULT_MAX_PENDING_RECORDS = 65536


class _Tracer:
    """One enable_tracing: what it records on calling threads (``recorder``), what writes
    the records on its own thread (``writer``), the queue between them and the counts."""

    def __init__(self, root: Path, policy: RecordPolicy) -> None:
        self.policy = policy
        self.pending = Pending()
        self.counts = Counts()
        self.recorder = Recorder(self.pending, self.counts, policy)
        self.writer = Writer(root, self.pending, self.counts)
        # A signal that came while this thread was draining (see _on_signal).
        self.pending_signal: tuple[int, Any] | None = None

    def start(self) -> None:
        self.writer.start()

    def drain(self) -> None:
        """Write every queued record (on the calling thread; the writer does the same)."""
        self.writer.drain()
        signalled, self.pending_signal = self.pending_signal, None
        if signalled is not None:
            _on_signal(*signalled)

    def stop(self) -> None:
        self.writer.stop()
        signalled, self.pending_signal = self.pending_signal, None
        if signalled is not None:
            _on_signal(*signalled)
        dump = self.policy.dump
        unmatched = dump.unmatched() if isinstance(dump, DumpByName) else None
        if unmatched and isinstance(dump, DumpByName):
            asked = sorted(set(dump.asked))  # a copy: no call is recorded any more
            self.counts.warn_once(
                "dump",
                f"dump={sorted(dump.names)}: no recorded call had a tensor input named "
                f"{', '.join(repr(n) for n in unmatched)}, so nothing was dumped for "
                f"{'it' if len(unmatched) == 1 else 'them'} (the recorded calls' tensor "
                f"inputs: {', '.join(asked)})",
            )

    def stats(self) -> dict[str, int]:
        counts = self.counts.read()
        counts["pending"] = len(self.pending.records)
        return {name: counts[name] for name in _STATS}


# ---------------------------------------------------------------------------------------
# Route wrapping (Note [tracing hooks])


def _wrap(tracer: _Tracer) -> Callable[[Api, str | None, Any], Any]:
    def wrap(api: Api, name: str | None, route: Any) -> Any:
        kind, fn, tick, values = route
        if api.trace_inputs is None and api.by_name:
            return _handwritten_route(tracer, api, name, route)
        if api.trace_inputs is None or fn is api.then:
            # Calls passed on to the next family of the same API (which records them itself).
            return route
        if name is None or name not in api.known_names:
            return (kind, _unrecorded(tracer, api, name, fn, "unknown"), tick, values)
        sources, checks = tracer.writer.sources, tracer.recorder.checks
        if name not in sources:
            sources[name] = definition_file(api, name)
        if name not in checks:
            checks[name] = input_check(api, sources[name])
        record = tracer.recorder.record
        if kind == ORIGINAL:
            to_inputs = api.trace_inputs

            def traced_original(*args: Any, **kwargs: Any) -> Any:
                try:
                    record(api, name, to_inputs(*args, **kwargs))
                except Exception as exc:
                    _record_failed(tracer, name, exc)
                return fn(*args, **kwargs)

            return (kind, traced_original, tick, values)
        names = api.inputs

        def traced(**kwargs: Any) -> Any:
            try:
                record(api, name, [kwargs[n] for n in names])
            except Exception as exc:
                _record_failed(tracer, name, exc)
            return fn(**kwargs)

        traced.__wrapped__ = fn  # type: ignore[attr-defined]  # for Api.failed
        return (kind, traced, tick, values)

    return wrap


def _handwritten_route(tracer: _Tracer, api: Api, name: Any, route: Any) -> Any:
    """The route of hand-written calls of ``name``, recording them (Note [recorded
    hand-written calls] in handwritten.py)."""
    kind, fn, tick, values = route
    found = _handwritten_target(tracer, api, name)
    if isinstance(found, str):
        why = ("definition", found)
        return (kind, _unrecorded(tracer, api, name, fn, "handwritten", why), tick, values)
    target, source = found
    if tracer.writer.sources.get(name) is None:
        tracer.writer.sources[name] = source
    record, read, check = tracer.recorder.record, target.values, target.check
    within, counts = tracer.recorder.within, tracer.counts

    def traced(*args: Any, **kwargs: Any) -> Any:
        names = getattr(within, "names", ())
        if name in names:  # inside a recorded call of the same definition
            counts.tick("inner")
            return fn(*args, **kwargs)
        recorded = False
        try:
            given = read(args, kwargs)
            if isinstance(given, str):  # not the definition's inputs
                _missed_call(tracer, api, "handwritten", name, ("arguments", given))
            else:
                problem = check(given)
                if problem is None:
                    record(target, name, given)
                    recorded = True
                else:
                    _missed_call(tracer, api, "mismatched", name, lambda: problem)
        except CaptureRead:
            _missed_call(tracer, api, "capturing", name, "scalars")
        except Exception as exc:
            _record_failed(tracer, name, exc)
        if not recorded:  # the calls it makes are recorded as their own
            within.failed = None
            return fn(*args, **kwargs)
        within.names = (*names, name)
        try:
            return fn(*args, **kwargs)
        except BaseException:
            within.failed = name  # its fallback, if one runs, is this recorded call
            raise
        finally:
            within.names = names

    traced.__wrapped__ = fn  # type: ignore[attr-defined]  # for Api.failed
    return (kind, traced, tick, values)


def _detour(tracer: _Tracer) -> Callable[[str, Callable[..., Any], Any, Any], Any]:
    """How a hand-written call whose solution failed runs its fallback: as the recorded call
    it still is, so that the fallback's own calls of the definition are inner ones."""
    within = tracer.recorder.within

    def detour(name: str, fallback: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        if getattr(within, "failed", None) != name:
            return fallback(*args, **kwargs)
        within.failed = None
        names = getattr(within, "names", ())
        within.names = (*names, name)
        try:
            return fallback(*args, **kwargs)
        finally:
            within.names = names

    return detour


def _handwritten_target(tracer: _Tracer, api: Api, name: Any) -> tuple[Target, Path] | str:
    """How hand-written calls of ``name`` are recorded, and the file of their definition: the
    traced dataset's, else the one of the dataset apply routes the name from, else fibgen's
    catalogue's; or why they cannot be (never an exception: it runs inside the call)."""
    if not isinstance(name, str):
        return f"{name!r} is not a definition name"
    entry = api.state.entries.get(name) if api.state.on else None
    roots = [r for r in (tracer.writer.root, getattr(entry, "root", None)) if r is not None]
    for root in [*roots, None]:
        try:
            found = solutions.own_definition(name, root)
        except Exception as exc:  # a dataset's definitions/ that cannot be read
            return f"the definitions of {root} cannot be read ({type(exc).__name__}: {exc})"
        if found is None:
            continue
        definition, file = found
        if not solutions.is_definition_json(definition):
            return f"{file} is not a Definition JSON (a name, axes, inputs, outputs, a reference)"
        try:
            return target_of(definition), file
        except Exception as exc:
            return f"{file} is not a definition tracing can read ({type(exc).__name__}: {exc})"
    places = ", ".join(f"{r}/definitions" for r in roots)
    return f"no definition of {name} is in {places} or fibgen's catalogue"


def _unrecorded(
    tracer: _Tracer,
    api: Api,
    name: str | None,
    fn: Callable[..., Any],
    reason: str,
    detail: Any = None,
) -> Callable[..., Any]:
    """A route whose calls are counted under ``reason``, said once, and not recorded: a
    definition that does not exist (``unknown``), or hand-written ``apply`` of no definition
    tracing can read (``handwritten``)."""

    def untraced(*args: Any, **kwargs: Any) -> Any:
        _missed_call(tracer, api, reason, name, detail)
        return fn(*args, **kwargs)

    untraced.__wrapped__ = fn  # type: ignore[attr-defined]  # for Api.failed
    return untraced


def _missed(tracer: _Tracer) -> Callable[[Api, str | None, str | None, Any], None]:
    """What the dispatchers tell of the calls no wrapped route sees (Note [missed calls]).

    ``detail``, for a refused call, is a function that says what it fails (called once).
    """

    def missed(api: Api, reason: str | None, name: str | None, detail: Any) -> None:
        if api.trace_inputs is None:
            # Hand-written apply(): refused by its input check (its tensors, or arguments that
            # are not the definition's), or first called in capture.
            if api.by_name and reason in ("mismatched", "capturing", "handwritten"):
                _missed_call(tracer, api, reason, name, detail)
            return
        reason = _PLAN_REASONS.get(reason, reason) or "unknown"
        _missed_call(tracer, api, reason, name, detail)

    return missed


# Why a run() is not routed (Note [plan state]), as tracing_stats() counts it.
_PLAN_REASONS: dict[str | None, str] = {"plan:unseen": "unplanned", "plan:changed": "plan_changed"}


def _missed_call(tracer: _Tracer, api: Api, reason: str, name: str | None, detail: Any) -> None:
    """Count a call that is not recorded, and say the first of its reason (Note [missed
    calls])."""
    counts = tracer.counts
    counts.tick(reason)
    # Said once per reason; a hand-written call's, once per name and kind (no definition,
    # arguments that are not its inputs): each is a mistake of its own. Calls in capture are
    # said apart from the recorder's (tensors it would copy): another cause, another remedy.
    key = f"handwritten {detail[0]} {name}" if reason == "handwritten" else reason
    if reason == "capturing":
        key = f"capturing {detail}"
    if key in counts.warned:
        return
    counted = f"tracing_stats()[{reason!r}] counts them"
    if reason == "unknown":
        what = (
            f"{api.label} was called for {name}, which is not a definition of its family (no "
            "instance declares those values)"
            if name is not None
            else f"{api.label} was called with values that name no definition of its family"
        )
        message = (
            f"{what}; such calls are not recorded, and {counted}. To record them, declare an "
            "instance with those values in the family's .fidef and rebuild"
        )
    elif reason == "unplanned":
        message = (
            f"a call of {api.label}() on a wrapper whose plan() tracing did not see (planned "
            "before enable_tracing, or before apply was last turned on or off) is not "
            f"recorded: its plan-time inputs are unknown; {counted}. To record its runs, call "
            "plan() again after enable_tracing (FIBGEN_TRACE=1 traces from the start)"
        )
    elif reason == "plan_changed":
        message = (
            f"a call of {api.label}() after the wrapper's plan state changed behind fibgen "
            "(a plan() through a method bound before tracing or apply was turned on, or "
            f"forward()) is not recorded; {counted}. To record its runs, call plan() through "
            "the wrapper itself, after enable_tracing"
        )
    elif reason == "handwritten" and detail[0] == "definition":
        message = (
            f"a call of hand-written code routed by name ({api.label}) for {name} is not "
            f"recorded: {detail[1]}; {counted}. To record such calls, put the definition's "
            f"JSON in {tracer.writer.root}/definitions/ (it is looked up again at the next "
            "enable_tracing)"
        )
    elif reason == "handwritten":
        message = (
            f"a call of hand-written code routed by name ({api.label}) for {name} is not "
            f"recorded: its arguments are not the definition's inputs ({detail[1]}); "
            f"{counted}. To record such calls, pass the definition's inputs (by position or "
            "by name, with or without its outputs)"
        )
    elif reason == "capturing" and detail == "scalars":
        message = (
            f"a call of {api.label} for {name} made while a CUDA graph is captured, with a "
            "scalar input given as a CUDA tensor, is not recorded: reading its value would "
            f"synchronize, which capture forbids; {counted}. To record such calls, make them "
            "outside capture (the eager warm-up), or pass such scalars as Python numbers"
        )
    elif reason == "capturing":  # first called in capture, with apply on: not routed yet
        message = (
            f"a call of {api.label} for {name} first made while a CUDA graph is captured is "
            f"not recorded: its route is decided, and wrapped for tracing, outside capture; "
            f"{counted}. To record such calls, make them once before capture (the eager "
            "warm-up)"
        )
    elif reason == "mismatched":  # with apply on, the dispatcher's tensor rule refused it
        message = mismatch_message(name, detail())
    else:  # refused
        message = (
            f"a call of {api.label} for {name} is not recorded: {detail()}, so it is not a "
            f"workload of {name}; {counted}. To record such calls, declare a definition (an "
            "instance in the .fidef) that they satisfy"
        )
    counts.warn_once(key, message)


def _record_failed(tracer: _Tracer, name: str, exc: Exception) -> None:
    # Tracing must never break a call: count the failure and warn once.
    next(tracer.counts.failed)
    tracer.counts.warn_failure(f"cannot record a call of {name}: {type(exc).__name__}: {exc}")


# ---------------------------------------------------------------------------------------
# Enabling, flushing on exit and on signals

_lock = threading.RLock()
_tracer: _Tracer | None = None
_last_stats: dict[str, int] | None = None
_atexit_registered = False
# signal number → the handler that was installed before ours
_previous_handlers: dict[int, Any] = {}
_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_STATS = Counts.STATS


def enable_tracing(
    dataset_dir: str | os.PathLike[str],
    *,
    dump: DumpPolicy = "none",
    dedup: DedupPolicy = "all",
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
    max_pending_records: int = DEFAULT_MAX_PENDING_RECORDS,
    patch: bool = False,
) -> None:
    """Record the workloads of calls through generated dispatchers into ``dataset_dir``.

    ``dump``: which input tensors to save ("none", "all", "int" for integer and bool
    tensors, or a list of input names); others are recorded as random. ``dedup``: which
    calls to keep per definition ("all", "axes" for the first per var-axis values,
    ("first", k), ("axes", k), or a function (definition, axes, inputs) -> key keeping the
    first call per key). ``patch``: also replace the real APIs (``flashinfer.norm.rmsnorm``)
    by their dispatchers while tracing, so that a program calling FlashInfer directly is
    recorded too; with apply off, each call still runs the original API. ``FIBGEN_TRACE=1``
    patches. Enabling again flushes and replaces the previous configuration.
    """
    global _tracer, _atexit_registered
    dump_rule = dump_rule_of(dump)
    keep = dedup_rule(dedup)
    for option, value in (
        ("max_pending_bytes", max_pending_bytes),
        ("max_pending_records", max_pending_records),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TracingConfigError(f"{option}={value!r}: must be an integer >= 0")
    if not str(dataset_dir).strip():  # Path("") is the current folder: never what was meant
        raise TracingConfigError("the dataset folder is empty (''); give the folder to write to")
    root = Path(dataset_dir)
    if root.exists() and not root.is_dir():
        raise TracingConfigError(f"dataset folder {root} exists and is not a folder")
    policy = RecordPolicy(dump_rule, keep, dedup != "all", max_pending_bytes, max_pending_records)
    solutions.forget_unfound()  # a definition added to a dataset since is seen
    tracer = _Tracer(root, policy)
    with _lock:
        disable_tracing()
        try:
            tracer.start()
        except OSError as exc:
            raise TracingConfigError(f"cannot create dataset folder {root}: {exc}") from None
        _tracer = tracer
        set_tracer(_wrap(tracer), patch=patch, missed=_missed(tracer), detour=_detour(tracer))
        if not _atexit_registered:
            atexit.register(disable_tracing)
            _atexit_registered = True
        _install_signal_handlers()


def disable_tracing() -> None:
    """Stop recording; write every pending record before returning."""
    global _tracer, _last_stats
    with _lock:
        tracer = _tracer
        if tracer is None:
            return
        set_tracer(None)
        _tracer = None
        _restore_signal_handlers()
        tracer.stop()
        _last_stats = tracer.stats()


def flush_tracing() -> None:
    """Write every record queued so far (tracing stays on)."""
    tracer = _tracer
    if tracer is not None:
        tracer.drain()


def is_tracing() -> bool:
    """Whether tracing is on."""
    return _tracer is not None


def tracing_stats() -> dict[str, int]:
    """Counts of the current (or last) tracing: recorded, filtered (by the dedup policy),
    written, pending, and the calls not recorded by reason (Note [missed calls]): dropped,
    failed, unknown, mismatched, unplanned, plan_changed, refused, capturing, handwritten;
    and inner: calls made inside a recorded hand-written call of the same definition (its body
    calling the API), which that call's record stands for."""
    tracer = _tracer
    if tracer is not None:
        return tracer.stats()
    return dict(_last_stats or dict.fromkeys(_STATS, 0))


def _on_signal(signum: int, frame: Any) -> None:
    tracer = _tracer
    if tracer is not None:
        if tracer.writer.drainer == threading.get_ident():
            # The signal interrupted a drain on this thread, holding records it popped: that
            # drain finishes them, then calls this handler again.
            tracer.pending_signal = (signum, frame)
            return
        # Waits for the writer thread to finish its batch, then writes the rest.
        tracer.drain()
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:
        # The default action (terminate): restore it and deliver the signal again.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_signal_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        # Python lets only the main thread set handlers; atexit and disable still flush.
        return
    for signum in _SIGNALS:
        current = signal.getsignal(signum)
        if current is _on_signal:
            continue
        _previous_handlers[signum] = signal.SIG_DFL if current is None else current
        signal.signal(signum, _on_signal)


def _restore_signal_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, previous in list(_previous_handlers.items()):
        # A handler installed after ours stays: it may chain to ours, which then only chains.
        if signal.getsignal(signum) is _on_signal:
            signal.signal(signum, previous)
            del _previous_handlers[signum]


# ---------------------------------------------------------------------------------------
# The environment


def enable_from_environment() -> None:
    """Enable tracing from FIBGEN_TRACE / FIBGEN_DATASET_PATH; warn and stay off when wrong."""

    def enable(path: str) -> None:
        enable_tracing(
            path,
            dump=parse_dump(os.environ.get("FIBGEN_TRACE_DUMP", "none")),
            dedup=parse_dedup(os.environ.get("FIBGEN_TRACE_DEDUP", "all")),
            # The environment switch is for programs that call FlashInfer, not fibgen.
            patch=True,
        )

    enable_from_env(
        "FIBGEN_TRACE",
        "FIBGEN_DATASET_PATH",
        "dataset folder",
        "tracing",
        enable,
        (TracingConfigError,),
    )
