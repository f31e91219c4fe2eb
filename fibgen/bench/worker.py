"""The benchmark worker: a separate process that runs solutions on one device.

The runner starts one worker per device (multiprocessing, spawn) and asks it over a pipe
(the messages are in messages.py):

- ``Prepare``: make the workload's inputs on the device, run the reference on them and time
  it as solutions are timed; replies ``Prepared`` (the reference's timing, hardware, libs),
  ``Invalid`` (one line) when the dataset's workload cannot be used, or ``Failed``.
- ``Evaluate``: load the solution, run it once on a copy of the inputs, compare with the
  reference (a sampler by the distribution of its draws, as many as fit in ``limit_s``,
  Note [judging samplers] in fibgen/runtime/checking/compare.py), check that the inputs are
  as they were (Note [mutated inputs]), and time it when it passed; replies ``Result``. With
  ``isolate`` the solution runs in a fresh process of its own that the worker judges, and
  the worker may also reply ``TimedOut`` or ``Died`` for it (Note [isolated solutions] in
  isolation.py).

A CPU worker runs torch with one thread and Triton under its interpreter (Note [CPU workers]
in device.py).

Anything a solution does to its process (``os.abort()``, a hang, a CUDA error that poisons
the context, a patched torch function) stays in that process, which ends with the solution.
Without ``isolate`` the process is this worker: the runner sees it die or time out, records
the status, and starts a new worker; after a CUDA error this worker reports and exits on its
own, since every later call on that context would fail too.
"""

from __future__ import annotations

import math
import os
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from fibgen.bench import messages as m
from fibgen.bench.device import hardware_name, library_versions, setup_device
from fibgen.runtime.checking.input_check import differences

if TYPE_CHECKING:
    from fibgen.bench.timing import Flush

# Statuses (flashinfer-bench's EvaluationStatus values).
PASSED = "PASSED"
INCORRECT_SHAPE = "INCORRECT_SHAPE"
INCORRECT_DTYPE = "INCORRECT_DTYPE"
INCORRECT_NUMERICAL = "INCORRECT_NUMERICAL"
RUNTIME_ERROR = "RUNTIME_ERROR"
COMPILE_ERROR = "COMPILE_ERROR"
TIMEOUT = "TIMEOUT"

# Trace logs keep the end of a traceback: the part that says what went wrong.
LOG_LIMIT = 4000
# Paired rounds of the e2e figures (Note [bench e2e]), after untimed ones: a process's first
# rounds run colder (allocator, caches) than the loop an engine settles into. A run given
# fewer timed calls (--repeat) or warmup calls (--warmup) gets fewer rounds of each, down to
# the two timed rounds a spread needs.
E2E_ROUNDS = 5
E2E_WARM_ROUNDS = 2


def e2e_rounds(repeat: int | None) -> int:
    """Timed paired rounds of the e2e figures for a run of ``repeat`` timed calls."""
    return E2E_ROUNDS if repeat is None else min(E2E_ROUNDS, max(2, repeat))


def e2e_warm_rounds(warmup: int) -> int:
    """Untimed rounds before them, for a run of ``warmup`` untimed calls."""
    return min(E2E_WARM_ROUNDS, max(0, warmup))


# Note [bench e2e]
# ~~~~~~~~~~~~~~~~
# A trace's e2e figure is what the call costs an engine's eager loop as apply delivers it:
# the call the engine makes (its API, its arguments; Note [api calls] in
# fibgen/runtime/inputs/api_calls.py), routed through the generated dispatcher to the solution with
# apply on and the APIs patched (a solution that calls the API it serves re-enters as it
# would in the engine, Note [re-entry]), launch replay active and settled. It is timed in
# paired rounds (fibgen/bench/eager.py) with the definition's reference and, where it runs
# here, the API's own function (apply off): each round times all of them within
# milliseconds, so the ratios cancel the host's drift; the spread of the solution/reference
# ratio over the rounds is recorded (``e2e_spread``), and a wide one is warned about as kernel
# timings are. The API's own function is also timed behind the L2 flush
# (``original_latency_ms``), so that selection can keep a key on FlashInfer's own kernel where
# no solution beats it. Where no dispatcher can make the call (a definition only the dataset
# has, a family whose inputs a rule computes) or the dispatcher did not serve every timed call
# with the solution (a rule refuses the workload), the solution is called directly with
# outputs allocated per call, ``e2e_routed`` is false, and the log says why.


def tail(text: str) -> str:
    return text if len(text) <= LOG_LIMIT else "..." + text[-LOG_LIMIT:]


def _is_cuda_error(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return "CUDA error" in text or "AcceleratorError" in text or "CUDA_ERROR" in text


class WorkloadInputs:
    """The inputs, reference outputs and output specs of the workload being run (in a
    solution process, ``expected`` holds only their shapes and dtypes, on the meta device)."""

    def __init__(
        self,
        definition: dict,
        inputs: dict[str, Any],
        expected: tuple,
        device: torch.device | None = None,
    ) -> None:
        self.definition = definition
        self.inputs = inputs
        self.expected = expected
        self.device = device
        self.input_names = tuple(definition["inputs"])
        self.output_names = tuple(definition["outputs"])


def _make_inputs(
    definition: dict, workload: dict, root: str, hints: dict, seed: int, device: torch.device
) -> dict[str, Any]:
    from fibgen.curation.workloads import materialize
    from fibgen.format.models import Workload
    from fibgen.runtime.inputs.make import InputSpec

    spec = InputSpec.from_definition_json(definition, hints)
    return materialize(spec, Workload.model_validate(workload), root, device=device, seed=seed)


# Note [returned outputs]
# fibgen's dispatchers take from a value-returning solution the output tensor itself when the
# definition has one output, and a tuple of them when it has several (anything else is
# refused: a 1-tuple, a list). flashinfer-bench's bench takes a tuple or a list of any
# length. A solution bench passes must run where apply routes it, so bench judges what was
# returned as the dispatchers do: ``as_tuple`` remembers what the outputs came in, and the
# check refuses a container the dispatcher would refuse (INCORRECT_SHAPE, as flashinfer-bench
# records a wrong number of outputs). Outputs written into buffers (a plain tuple) are
# whatever the buffers hold.


class Returned(tuple):
    """The outputs a solution returned, and what they came in: "value" (one output on its
    own), "tuple" or "list" (Note [returned outputs])."""

    container: str

    def __new__(cls, values: Any, container: str) -> Returned:
        out = super().__new__(cls, values)
        out.container = container
        return out


def as_tuple(value: Any) -> tuple:
    if isinstance(value, tuple):
        return Returned(value, "tuple")
    if isinstance(value, list):
        return Returned(value, "list")
    return Returned((value,), "value")


def _container_problem(actual: tuple, names: tuple[str, ...]) -> str | None:
    """Why fibgen's dispatcher would refuse what a solution returned; None when it takes it
    (Note [returned outputs])."""
    container = getattr(actual, "container", None)
    if container is None:  # buffers the solution wrote into
        return None
    if len(names) == 1 and container != "value":
        return (
            f"returned a {container} of {len(actual)}; a definition with one output "
            f"({names[0]}) takes the tensor itself, as fibgen's dispatcher does (it refuses a "
            f"{container})"
        )
    if len(names) > 1 and container == "list":
        return (
            f"returned a list of {len(actual)}; a definition with {len(names)} outputs takes a "
            f"tuple of them ({', '.join(names)}), as fibgen's dispatcher does (it refuses a list)"
        )
    return None


def _clone(inputs: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _empty_outputs(work: WorkloadInputs) -> dict[str, torch.Tensor]:
    # Poisoned with NaN (or the largest value) so that an element left unwritten fails.
    out = {}
    for name, expected in zip(work.output_names, work.expected):
        device = work.device or expected.device
        buf = torch.empty(expected.shape, dtype=expected.dtype, device=device)
        if buf.is_floating_point() and buf.element_size() > 1:
            buf.fill_(float("nan"))
        out[name] = buf
    return out


class Worker:
    """The state of one worker process: its device and the current workload."""

    def __init__(
        self, device: str, solution_process: Callable[[torch.device], Any] | None = None
    ) -> None:
        self.device = torch.device(device)
        setup_device(self.device)
        self.work: WorkloadInputs | None = None
        self.reference: Any = None
        # What starts a solution's own process (isolation.SolutionProcess, given by the
        # worker's entry, fibgen/bench/child.py); None where solutions run in this process.
        self.solution_process = solution_process

    @property
    def prepared(self) -> WorkloadInputs:
        """The workload prepared last; Prepare comes before every Evaluate."""
        if self.work is None:
            raise RuntimeError("no workload is prepared: a Prepare comes before an Evaluate")
        return self.work

    def prepare(self, request: m.Prepare) -> m.Prepared | m.Invalid:
        """Make inputs and the reference outputs; time the reference as solutions are timed."""
        from fibgen.bench.timing import measure
        from fibgen.curation.workloads import WorkloadError

        try:
            inputs = _make_inputs(
                request.definition,
                request.workload,
                request.root,
                request.hints,
                request.seed,
                self.device,
            )
        except WorkloadError as exc:
            # A refused workload (a stored path that escapes the dataset, a missing blob, a
            # tensor of another shape) is the dataset's mistake, said in one line that names
            # the workload and input; a traceback would only show where fibgen noticed.
            return m.Invalid(str(exc))
        reference = self.reference = load_reference(request.definition)
        expected = as_tuple(reference(**_clone(inputs)))
        _sync(self.device)
        self.work = WorkloadInputs(request.definition, inputs, expected, self.device)
        args = _clone(inputs)
        timing = measure(
            lambda: reference(**args),
            self.device,
            warmup=request.warmup,
            repeat=request.repeat,
            flush=request.flush,
        )
        figures = _timing(timing, self._e2e(lambda: reference(**args), request.repeat))
        return m.Prepared(figures, hardware_name(self.device), library_versions())

    def run(self, request: m.Evaluate) -> m.Result | m.TimedOut | m.Died | m.Failed:
        """Evaluate one solution, in a process of its own unless ``isolate`` is off (Note
        [isolated solutions] in isolation.py); the reply for the runner."""
        run = request.run
        if not request.isolate:
            return m.Result(self.evaluate(run))
        if self.solution_process is None:
            raise RuntimeError("this worker cannot start a process per solution")
        process = self.solution_process(self.device)
        try:
            return process.run(self, run)
        finally:
            process.kill()

    def _e2e(self, call: Any, repeat: int | None) -> float:
        """End-to-end eager latency of ``call`` in ms (Note [eager rounds], bench/eager.py)."""
        from fibgen.bench.eager import time_eager

        return time_eager(call, device=self.device, rounds=e2e_rounds(repeat)) / 1e3

    def _api_call(self, name: str) -> Any:
        """The checked API call of the workload's inputs (Note [api calls] in
        fibgen/runtime/inputs/api_calls.py); CallUnavailable says why there is none."""
        from fibgen.runtime.inputs import api_calls

        work = self.prepared
        api = api_calls.api_for(name, work.definition)
        if api is None:
            raise api_calls.CallUnavailable(
                f"no dispatcher routes {name} (fibgen's catalogue has no such definition)"
            )
        inputs = _clone(work.inputs)
        call = api_calls.build(
            api, name, work.definition, inputs, _empty_outputs(work), self.device
        )
        call.check(inputs)
        return call

    def _e2e_figures(
        self, model: Any, loaded: Any, args: dict, warmup: int, repeat: Any, flush: Flush
    ) -> dict:
        """The e2e figures of a solution that passed (Note [bench e2e])."""
        import statistics
        import warnings

        from fibgen.bench.eager import eager_rounds, per_call
        from fibgen.bench.timing import measure
        from fibgen.runtime.inputs import api_calls
        from fibgen.runtime.routing.apply import disable_apply, enable_apply, stats

        work = self.prepared
        name = work.definition["name"]
        reference = self.reference
        timed = e2e_rounds(repeat)
        ref_args = _clone(work.inputs)
        fns: dict[str, Any] = {"reference": lambda: reference(**ref_args)}
        figures: dict[str, Any] = {}
        try:
            call = self._api_call(name)
        except api_calls.CallUnavailable as exc:
            call, why = None, str(exc)
        notes = []
        if call is None:
            fns["solution"] = (
                (lambda: loaded.fn(**args, **_empty_outputs(work)))
                if loaded.dps
                else (lambda: loaded.fn(**args))
            )
            rounds = eager_rounds(fns, device=self.device, rounds=timed)
            figures["e2e_routed"] = False
            notes.append(f"e2e: the solution called directly, not through a dispatcher: {why}")
        else:
            label = call.api.label
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # Patched as in an engine: a solution that calls the API it serves re-enters
                # the dispatcher, and is timed with what that costs (Note [re-entry]).
                enable_apply({name: model}, patch=True)
            try:
                call.capture()
                call.routed()
                _sync(self.device)
                from fibgen.runtime.launch.replay import native_problem, wait_native

                wait_native()  # timed as a settled process runs it
                problem = native_problem()
                if problem is not None:  # a slower path than a settled process takes
                    notes.append("e2e: " + problem.removeprefix("fibgen: "))
                fns["solution"] = call.routed
                host_only = cuda_only(call.api.original(), self.device)
                if host_only is not None:
                    notes.append(host_only)
                else:
                    try:
                        call.original()
                        _sync(self.device)
                        fns["original"] = call.original
                    except Exception as exc:  # noqa: BLE001 - the original may not run here
                        notes.append(
                            f"the API's own function does not run here ({type(exc).__name__}: "
                            f"{_first_line(exc)})"
                        )
                warm = e2e_warm_rounds(warmup)
                if warm:
                    eager_rounds(fns, device=self.device, rounds=warm)
                rounds = eager_rounds(fns, device=self.device, rounds=timed)
                counts = stats().get(label, {})
            finally:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    disable_apply()
            served = counts.get("hit", 0) > 0 and not any(
                counts.get(k, 0)
                for k in ("error", "fallback_no_candidate", "fallback_guard", "fallback_declined")
            )
            if not served:
                # The routed figure is not the solution's: time it directly, and say why.
                fns.pop("original", None)
                fns["solution"] = (
                    (lambda: loaded.fn(**args, **_empty_outputs(work)))
                    if loaded.dps
                    else (lambda: loaded.fn(**args))
                )
                rounds = eager_rounds(fns, device=self.device, rounds=timed)
                figures["e2e_routed"] = False
                notes.append(
                    f"e2e: the solution called directly: the dispatcher of {label} did not "
                    f"serve every call with it ({_counted(counts)})"
                )
            else:
                figures["e2e_routed"] = True
                notes.append(f"e2e: routed through the dispatcher of {label}")
                if "original" in fns:
                    try:
                        original = measure(
                            call.original, self.device, warmup=warmup, repeat=repeat, flush=flush
                        )
                        figures["original_ms"] = original.median_ms
                    except Exception as exc:  # noqa: BLE001
                        notes.append(f"the API's own function could not be timed: {exc}")
        each = {k: [per_call(c) for c in v] for k, v in rounds.items()}
        figures["e2e_ms"] = statistics.median(each["solution"]) / 1e3
        figures["reference_e2e_ms"] = statistics.median(each["reference"]) / 1e3
        if "original" in each:
            figures["original_e2e_ms"] = statistics.median(each["original"]) / 1e3
        # The spread of the paired ratio: the host's drift cancels within a round.
        ratios = [s / r for s, r in zip(each["solution"], each["reference"]) if r > 0]
        if len(ratios) >= 2:
            q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
            middle = statistics.median(ratios)
            figures["e2e_spread"] = (q3 - q1) / middle if middle > 0 else math.inf
        figures["e2e_note"] = "; ".join(notes)
        return figures

    def evaluate(self, run: m.Run) -> dict:
        """Run one solution on the current workload; the fields of its Evaluation.

        ``run.limit_s`` is how long the runner waits for the reply: a sampler's draws are sized
        to fit in it (Note [judging samplers] in fibgen/runtime/checking/compare.py).
        ``run.origin`` (the solution's JSON and whether its sources are a folder's files)
        names the user's files in logs.
        """
        started = time.perf_counter()
        tolerance, warmup, repeat, flush = run.tolerance, run.warmup, run.repeat, run.flush
        limit_s, origin = run.limit_s, run.origin
        from fibgen.format.models import Solution
        from fibgen.runtime.errors import SolutionError
        from fibgen.runtime.solutions import loading as solutions

        work = self.prepared
        model = Solution.model_validate(run.solution)
        entry = solutions.Entry(
            model.definition,
            f"solution {model.name!r}",
            solution=model,
            origin=solutions.Origin(*origin) if origin else None,
        )
        try:
            loaded = solutions.load(
                entry, work.input_names, work.output_names, _scalars(work.definition)
            )
            # Timed as a settled process runs it: with the C++ replay table, once built.
            from fibgen.runtime.launch.replay import wait_native

            wait_native()
        except SolutionError as exc:
            return {"status": COMPILE_ERROR, "log": _load_failure(exc)}
        args = self._call_inputs()
        try:
            if loaded.dps:
                outputs = _empty_outputs(work)
                call = lambda: loaded.fn(**args, **outputs)  # noqa: E731
                call()
                actual = tuple(outputs.values())
            else:
                call = lambda: loaded.fn(**args)  # noqa: E731
                actual = as_tuple(call())
            _sync(self.device)
        except Exception as exc:
            return self._failure(exc)
        sampler = definition_is_sampling(work.definition)
        # A sampler's ids are not compared one by one: its draws are judged below.
        problem, errors = self.check_outputs(actual, tolerance, values=not sampler, inputs=args)
        if problem is None and sampler:
            try:
                problem, errors = self._check_sampler(loaded, started, limit_s)
            except Exception as exc:
                return self._failure(exc)
        if problem is not None:
            return problem
        from fibgen.bench.timing import measure

        try:
            timing = measure(call, self.device, warmup=warmup, repeat=repeat, flush=flush)
            e2e = self._e2e_figures(model, loaded, args, warmup, repeat, flush)
            if not sampler:
                # The timed calls took the path a settled process takes (replayed launches,
                # Note [launch replay]): what they compute is checked too, not only the first.
                if loaded.dps:
                    outputs = _empty_outputs(work)
                    loaded.fn(**args, **outputs)
                    again = tuple(outputs.values())
                else:
                    again = as_tuple(loaded.fn(**args))
                _sync(self.device)
                problem, _ = self.check_outputs(again, tolerance, values=True)
                if problem is not None:
                    problem["log"] = "after timing, a call of the solution: " + problem["log"]
                    return problem
        except Exception as exc:
            return self._failure(exc)
        return {"status": PASSED, "correctness": errors, "timing": _timing(timing, e2e)}

    def _check_sampler(
        self, loaded: Any, started: float, limit_s: float | None
    ) -> tuple[dict | None, dict]:
        """Judge a sampler by its draws against the reference's (Note [judging samplers])."""
        from fibgen.runtime.solutions.loading import allocate_outputs

        work = self.prepared

        def draw(inputs: dict[str, Any]) -> Any:
            if loaded.dps:
                outputs = allocate_outputs(work.definition, inputs)
                loaded.fn(**inputs, **outputs)
                return next(iter(outputs.values()))
            return as_tuple(loaded.fn(**inputs))[0]

        return self.judge_sampler(draw, time.perf_counter() - started, limit_s)

    def judge_sampler(
        self, draw: Any, spent: float, limit_s: float | None
    ) -> tuple[dict | None, dict]:
        """The verdict on a sampler whose draws ``draw(inputs)`` makes, ``spent`` seconds
        into its ``limit_s``: the reference draws here, where the solution never ran."""
        from fibgen.runtime.checking.compare import (
            SAMPLING_BUDGET_SHARE,
            SAMPLING_TIMEOUT_SCALE,
            compare_sampling,
            sampling_correctness,
        )

        work = self.prepared
        reference = self.reference
        budget = None if limit_s is None else max(0.0, limit_s * SAMPLING_BUDGET_SHARE - spent)
        result = compare_sampling(
            draw,
            lambda inputs: as_tuple(reference(**inputs))[0],
            _clone(work.inputs),
            work.definition,
            budget_s=budget,
        )
        if result.timed_out:
            share = SAMPLING_BUDGET_SHARE * SAMPLING_TIMEOUT_SCALE
            timeout = math.ceil((spent + result.seconds_needed) / share / 10) * 10
            return {
                "status": TIMEOUT,
                "log": f"output {work.output_names[0]!r}: {result.reason}; judging it may "
                f"take up to {result.needed} draws per row, about {result.seconds_needed:.0f} s "
                f"here: give --timeout {timeout} (a sampler gets {SAMPLING_TIMEOUT_SCALE} times "
                "--timeout), or bench it at smaller batch sizes",
            }, {}
        # As flashinfer-bench's readers take a sampler's verdict (Note [sampler traces]).
        errors = sampling_correctness(result)
        if result.ok:
            return None, errors
        return {
            "status": INCORRECT_NUMERICAL,
            "log": f"output {work.output_names[0]!r}: {result}",
            "correctness": errors,
        }, errors

    def _failure(self, exc: BaseException) -> dict:
        status = COMPILE_ERROR if "CompilationError" in type(exc).__name__ else RUNTIME_ERROR
        result: dict[str, Any] = {"status": status, "log": tail(format(exc))}
        if _is_cuda_error(exc):
            result["fatal"] = True
        return result

    def _call_inputs(self) -> dict[str, Any]:
        """The inputs of the solution's checked call: a copy of the workload's."""
        return _clone(self.prepared.inputs)

    def check_outputs(
        self, actual: tuple, tolerance: dict, values: bool = True, inputs: Any = None
    ) -> tuple[dict | None, dict]:
        """The problem with a solution's outputs (None when they pass) and their errors;
        with ``inputs``, those of the call, which must be as the workload's still."""
        problem, errors = self._check_outputs(actual, tolerance, values)
        changed = [] if inputs is None else list(differences(self.prepared.inputs, inputs).values())
        if not changed:
            return problem, errors
        mutated = (
            f"the call changed its input(s): {'; '.join(changed)}; a solution must leave its "
            "inputs as it found them (the caller reads them after the call, and so does "
            "apply's fallback)"
        )
        if problem is not None:
            return {**problem, "log": f"{problem['log']}\n{mutated}"}, errors
        # Note [mutated inputs]: what the caller sees is wrong, as a wrong output is.
        return {"status": INCORRECT_NUMERICAL, "log": mutated, "correctness": errors}, errors

    def _check_outputs(
        self, actual: tuple, tolerance: dict, values: bool = True
    ) -> tuple[dict | None, dict]:
        from fibgen.runtime.checking.compare import compare

        work = self.prepared
        names = work.output_names
        refused = _container_problem(actual, names)
        if refused is not None:
            return {"status": INCORRECT_SHAPE, "log": refused}, {}
        if len(actual) != len(work.expected):
            log = f"returned {len(actual)} output(s), expected {len(names)} ({', '.join(names)})"
            return {"status": INCORRECT_SHAPE, "log": log}, {}
        max_abs = max_rel = 0.0
        numerical = []
        for name, got, want in zip(names, actual, work.expected):
            if not isinstance(got, torch.Tensor):
                # A number stands for a 0-D output, as flashinfer-bench converts it. Anything
                # else (None: a forgotten return) is no tensor at all, so it has no shape: it
                # is INCORRECT_SHAPE, checked before the dtype as every output is.
                converted = number_tensor(got)
                if converted is None:
                    log = (
                        f"output {name!r} is {kind_of(got)}, expected a tensor of shape "
                        f"{list(want.shape)} and dtype {want.dtype}"
                    )
                    return {"status": INCORRECT_SHAPE, "log": log}, {}
                got = converted
            if tuple(got.shape) != tuple(want.shape):
                log = f"output {name!r} has shape {list(got.shape)}, expected {list(want.shape)}"
                return {"status": INCORRECT_SHAPE, "log": log}, {}
            if got.dtype != want.dtype:
                log = f"output {name!r} has dtype {got.dtype}, expected {want.dtype}"
                return {"status": INCORRECT_DTYPE, "log": log}, {}
            if not values:
                continue
            result = compare(got, want, **tolerance)
            abs_err, rel_err = result.max_abs_err, result.max_rel_err
            special = _non_finite_error(got, want)
            if special is not None:
                abs_err = rel_err = special
            max_abs = _worse(max_abs, abs_err)
            max_rel = _worse(max_rel, rel_err)
            if not result.ok:
                # compare counts a NaN as an infinite error; say what the output holds.
                holds_nan = special is not None and math.isnan(special)
                note = " (it holds NaN where the reference does not)" if holds_nan else ""
                numerical.append(f"output {name!r}: {result}{note}")
        errors = {"max_absolute_error": max_abs, "max_relative_error": max_rel}
        if numerical:
            log = "\n".join(numerical)
            return {"status": INCORRECT_NUMERICAL, "log": log, "correctness": errors}, errors
        return None, errors


# Note [mutated inputs]
# A solution that writes into its inputs hands its caller back other tensors than it was
# given: a serving engine reads them again (a residual, a KV cache, a probability row), and
# apply's fallback, which calls the original API with the same tensors, would compute on the
# changed ones. Bench compares every input tensor of the checked call, byte for byte, with the
# workload's after the call, and fails a solution that changed one, naming the input and how
# many elements differ. The status is INCORRECT_NUMERICAL: flashinfer-bench, which does not
# look at inputs, keeps RUNTIME_ERROR for a call that raised or crashed and the INCORRECT_*
# statuses for results the caller receives wrong, which a changed input is (a wrong value in
# memory the caller reads); the log says what it is.


def load_reference(definition: dict) -> Any:
    """The ``run`` function of a definition's reference code."""
    namespace: dict[str, Any] = {"__name__": f"fibgen_reference_{definition['name']}"}
    exec(
        compile(definition["reference"], f"<reference of {definition['name']}>", "exec"),
        namespace,
    )
    return namespace["run"]


def _scalars(definition: dict) -> frozenset[str]:
    """The inputs of a definition that are values, not tensors (``shape: null``)."""
    return frozenset(n for n, t in definition["inputs"].items() if t.get("shape") is None)


def number_tensor(value: Any) -> torch.Tensor | None:
    """A Python or NumPy number as a 0-D tensor; None for anything else."""
    if isinstance(value, (bool, int, float)) or type(value).__module__ == "numpy":
        try:
            return torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            return None
    return None


class Described:
    """An output that is no tensor nor number, by the words of the solution process that
    sent it in its place (Note [isolated solutions] in isolation.py)."""

    def __init__(self, description: str) -> None:
        self.description = description


def kind_of(value: Any) -> str:
    if isinstance(value, Described):
        return value.description
    if value is None:
        return "None"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def _non_finite_error(got: torch.Tensor, want: torch.Tensor) -> float | None:
    """The error flashinfer-bench records for non-finite output values: inf when the output
    has an infinity the reference does not, else NaN when it has a NaN the reference does not;
    None when neither (values the reference has at the same place match, as in compare)."""
    if not got.is_floating_point() or "float4" in str(got.dtype) or got.numel() == 0:
        return None
    g = got.detach().to("cpu", torch.float64)
    e = want.detach().to("cpu", torch.float64)
    if bool((g.isinf() & (g != e)).any()):
        return math.inf
    if bool((g.isnan() & ~e.isnan()).any()):
        return math.nan
    return None


def _worse(a: float, b: float) -> float:
    # max() ignores NaN (every comparison with it is false): an infinity wins, then a NaN.
    if math.isinf(a) or math.isinf(b):
        return math.inf
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)


def definition_is_sampling(definition: dict) -> bool:
    from fibgen.runtime.checking.compare import is_sampling

    return is_sampling(definition)


def _timing(timing: Any, e2e: float | dict) -> dict:
    out = {
        "median_ms": timing.median_ms,
        "q1_ms": timing.q1_ms,
        "q3_ms": timing.q3_ms,
        "samples": timing.samples,
        "calls_per_sample": timing.calls_per_sample,
    }
    out.update(e2e if isinstance(e2e, dict) else {"e2e_ms": e2e})
    return out


def cuda_only(original: Any, device: torch.device) -> str | None:
    """Why the API's own function is not called on ``device``, or None. FlashInfer's take
    CUDA tensors only, and do not check: given host tensors on a machine with a GPU, its
    kernels launch on host addresses, which fails the CUDA context for the rest of the
    process (an illegal memory access). Where CUDA is not available they raise, or run a
    stand-in, and are called as any API's."""
    module = getattr(original, "__module__", None) or ""
    if torch.device(device).type != "cpu" or module.split(".")[0] != "flashinfer":
        return None
    if not torch.cuda.is_available():
        return None
    return "the API's own function is FlashInfer's, which takes CUDA tensors: not timed on cpu"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""


def _counted(counts: dict) -> str:
    shown = ", ".join(f"{k} {v}" for k, v in counts.items() if v and k != "rules")
    return shown or "no call counted"


def format(exc: BaseException) -> str:
    """A traceback from the solution's own first line on where it has one (Note [source
    names] in fibgen/runtime/solutions/loading.py): the runner's frames above it say nothing."""
    from fibgen.runtime.solutions.loading import solution_traceback

    shown = solution_traceback(exc)
    if shown is not None:
        return shown
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _load_failure(exc: BaseException) -> str:
    """The log of a solution that did not load: the traceback through its own files, if it
    has one, then what fibgen says of it, which names the solution and what to do (a missing
    Triton, a build's compiler messages) and which a long traceback never pushes out."""
    from fibgen.runtime.solutions.loading import solution_traceback

    message = str(exc)
    cause = exc.__cause__
    detail = solution_traceback(cause) if cause is not None else None
    if not detail:
        return tail(message)
    room = max(LOG_LIMIT - len(message) - 1, 0)
    if len(detail) > room:
        detail = "..." + detail[len(detail) - room :]
    return detail.rstrip("\n") + "\n" + message


def main(conn: Any, device: str, solution_process: Callable[[torch.device], Any]) -> None:
    """The worker's loop: answer requests until told to stop or the pipe closes.

    The runner starts it through ``fibgen.bench.child.main``, which first ties the
    worker's life to the runner's (Note [worker lifetime] there).
    """
    # A worker must not be stopped by the Ctrl-C meant for the runner: the runner stops it.
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        worker: Worker | None = Worker(device, solution_process)
        broken = ""
    except Exception as exc:
        # Said in reply to every request, rather than a worker that dies with no reason.
        worker, broken = None, f"cannot run on device {device}: {type(exc).__name__}: {exc}"
    # Started: the runner's request timeouts count from here (Note [worker start] in
    # worker_handle.py).
    conn.send(m.Started())
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if isinstance(request, m.Stop):
            return
        reply: m.Reply
        if worker is None:
            conn.send(m.Failed(broken))
            continue
        try:
            if isinstance(request, m.Prepare):
                reply = worker.prepare(request)
            elif isinstance(request, m.Evaluate):
                reply = worker.run(request)
            else:
                reply = m.Failed(f"not a question a worker answers: {type(request).__name__}")
        except Exception as exc:
            reply = m.Failed(tail(format(exc)))
        conn.send(reply)
        if isinstance(reply, m.Result) and reply.fields.get("fatal"):
            os._exit(1)
