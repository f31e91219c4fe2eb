"""Each solution in a process of its own, checked by the worker that never runs one.

Note [isolated solutions]
~~~~~~~~~~~~~~~~~~~~~~~~~
A worker process used to run every solution of a workload, one after the other, and check
each in the same process. What a solution did at import stayed for the next: one that set
``torch.rsqrt = lambda x: torch.ones_like(x)`` made a wrong solution benched after it pass,
and one that patched the worker's check made a wrong-dtype solution PASS at 973 times the
reference's speed, which selection then routed to. A verdict or a time must not depend on
what ran before it, nor on the solution's own reach into the check. So (as flashinfer-bench's
isolated runner does, and any harness a result can be trusted from):

- The worker process (the *judge*) makes the inputs, runs and times the reference, and
  never imports a solution. For each solution it starts a fresh *solution process*, forked
  from a server process (multiprocessing's forkserver) that has imported torch and fibgen's
  bench and nothing else, so that a start costs a fork rather than an interpreter and
  torch's import; then the process runs ``Worker.evaluate`` as the worker once did, and exits.
- The judge lends the solution process a copy of the inputs in memory both can see (CUDA IPC
  on a GPU, a shared file mapping on a CPU): the checked call runs on them, and the judge
  compares them afterwards with its own untouched inputs (Note [mutated inputs]).
- Outputs come back to the judge as bytes with a JSON header (no pickle: nothing the solution
  process sends can run code in the judge), and the judge compares them with the reference
  outputs, which the solution process never holds. A sampler's draws are judged the same
  way: the judge asks for each batch of draws, and draws the reference's itself.
- The judge's verdicts are what a trace records: a solution process that reports PASSED
  without both of its checks (the first call, and a call after timing) having passed the
  judge is recorded as failing, whatever it says.

What the judge cannot see is how the solution process measures its own time: a solution
that rewrites the timer of its own process can lie about its speed, as it could under
flashinfer-bench. It can no longer lie for another solution, nor pass a wrong result.
``BenchOptions.isolate=False`` runs solutions in the worker itself, as before, only to
measure what isolation costs (``benchmarks/isolation.py``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import tempfile
import time
from typing import Any

import torch

# What a solution process needs, imported once by the fork server rather than in each
# process (Note [isolated solutions]).
from fibgen.bench import eager as _eager  # noqa: F401
from fibgen.bench import messages as m
from fibgen.bench import timing as _timing  # noqa: F401
from fibgen.bench import worker as w

# A new solution process is forked, then sets up its device (a CUDA context on a GPU): that
# start is not charged to the solution's timeout (Note [worker start] in worker_handle.py).
from fibgen.bench.lifetime import START_TIMEOUT, death_of, die_with_parent, fork_server
from fibgen.format import models as _models  # noqa: F401
from fibgen.runtime.checking import compare as _compare  # noqa: F401
from fibgen.runtime.launch import fast as _launch  # noqa: F401
from fibgen.runtime.launch import replay as _replay  # noqa: F401
from fibgen.runtime.solutions import loading as _solutions  # noqa: F401

# ---------------------------------------------------------------------------------------
# The wire: what a solution process sends is JSON and raw bytes, never pickle


def _send(conn: Any, message: dict, frames: tuple = ()) -> None:
    conn.send_bytes(json.dumps({**message, "frames": len(frames)}).encode("utf-8"))
    for frame in frames:
        conn.send_bytes(frame)


class _Broken(Exception):
    """What a solution process sent is not what one sends: the solution changed bench's code
    in its process, or broke the process's state."""


def _receive(conn: Any, timeout: float | None) -> tuple[dict, list[bytearray]] | None:
    """The next message of a solution process and its frames; None when none came in time."""
    if timeout is not None and not conn.poll(max(0.0, timeout)):
        return None
    try:
        message = json.loads(conn.recv_bytes().decode("utf-8"))
    except ValueError as exc:  # not UTF-8, not JSON
        raise _Broken(f"a message that is not JSON ({exc})") from None
    if not isinstance(message, dict) or not isinstance(message.get("frames"), int):
        raise _Broken("a message that is not a JSON object with its frame count")
    frames = [bytearray(conn.recv_bytes()) for _ in range(message["frames"])]
    return message, frames


def _parsed(parse: Any, *args: Any) -> Any:
    """``parse(*args)`` on what a solution process sent; _Broken when it is malformed."""
    try:
        return parse(*args)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise _Broken(f"{type(exc).__name__}: {exc}") from None


def _tensor_bytes(tensor: torch.Tensor) -> tuple[dict, bytes]:
    """A tensor as its header and its bytes (those of the CPU copy, contiguous)."""
    import ctypes

    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    size = flat.numel() * flat.element_size()
    data = ctypes.string_at(flat.data_ptr(), size) if size else b""
    return {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape)}, data


def _dtype(name: Any) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is no torch dtype")
    return dtype


def _tensor(header: dict, frame: bytearray, device: torch.device) -> torch.Tensor:
    """The tensor a header and its bytes describe, on ``device``."""
    dtype = _dtype(header.get("dtype"))
    shape = header.get("shape")
    if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ValueError(f"shape {shape!r} is no list of sizes")
    numel = math.prod(shape)
    size = numel * torch.empty(0, dtype=dtype).element_size()
    if len(frame) != size:
        raise ValueError(f"{len(frame)} bytes for a {dtype} tensor of shape {shape}")
    if not numel:
        return torch.empty(shape, dtype=dtype, device=device)
    flat = torch.frombuffer(frame, dtype=torch.uint8).view(dtype)
    return flat.reshape(shape).to(device)


def _outputs_message(actual: tuple) -> tuple[dict, tuple]:
    """What a solution returned (or wrote), as a check message's fields and frames."""
    outputs: list[dict[str, Any]] = []
    frames: list[bytes] = []
    for value in actual:
        if isinstance(value, torch.Tensor):
            header, data = _tensor_bytes(value)
            outputs.append({"tensor": header})
            frames.append(data)
        elif w.number_tensor(value) is not None:
            outputs.append({"number": value.item() if hasattr(value, "item") else value})
        else:
            outputs.append({"other": w.kind_of(value)})
    container = getattr(actual, "container", None) or "buffers"
    return {"outputs": outputs, "container": container}, tuple(frames)


def _outputs(message: dict, frames: list[bytearray], device: torch.device) -> tuple:
    """The outputs a check message holds, as the check takes them (``w.Returned``)."""
    values: list[Any] = []
    frames = list(frames)
    for item in message["outputs"]:
        if "tensor" in item:
            values.append(_tensor(item["tensor"], frames.pop(0), device))
        elif "number" in item and isinstance(item["number"], (bool, int, float)):
            values.append(item["number"])
        else:
            values.append(w.Described(str(item.get("other", "something unknown"))))
    container = message.get("container")
    if container == "buffers":
        return tuple(values)
    if container not in ("value", "tuple", "list"):
        raise ValueError(f"unknown container {container!r}")
    return w.Returned(values, container)


# ---------------------------------------------------------------------------------------
# The judge's side


def _lend(inputs: dict[str, Any], folder: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Copies of the inputs that a solution process can use and the judge still sees:
    (what the judge keeps, what is sent). A CUDA tensor goes by CUDA IPC; a CPU tensor
    is written to a file in ``folder`` that both processes map."""
    kept: dict[str, Any] = {}
    sent: dict[str, Any] = {}
    for name, value in inputs.items():
        if not isinstance(value, torch.Tensor):
            kept[name] = value
            sent[name] = ("value", value)
        elif value.device.type == "cuda":
            kept[name] = value.clone()
            sent[name] = ("tensor", kept[name])
        else:
            size = value.numel() * value.element_size()
            dtype = str(value.dtype).removeprefix("torch.")
            if size == 0:
                kept[name] = value.clone()
                sent[name] = ("empty", dtype, list(value.shape))
                continue
            path = os.path.join(folder, f"{len(sent)}.bin")
            with open(path, "wb"):
                pass
            flat = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
            kept[name] = flat.view(value.dtype).reshape(value.shape)
            kept[name].copy_(value)
            sent[name] = ("file", path, size, dtype, list(value.shape))
    return kept, sent


def _borrowed(sent: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """In the solution process: the inputs the judge lent (``_lend``)."""
    inputs = {}
    for name, item in sent.items():
        kind = item[0]
        if kind == "value":
            inputs[name] = item[1]
        elif kind == "tensor":
            inputs[name] = item[1]
        elif kind == "empty":
            inputs[name] = torch.empty(item[2], dtype=_dtype(item[1]), device=device)
        else:
            _, path, size, dtype, shape = item
            flat = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
            inputs[name] = flat.view(_dtype(dtype)).reshape(shape)
    return inputs


def _shared_folder(inputs: dict[str, Any]) -> str:
    """Where a CPU workload's inputs are lent: /dev/shm (memory) when it has room, else the
    temporary folder (a file the page cache holds as well)."""
    need = sum(
        v.numel() * v.element_size()
        for v in inputs.values()
        if isinstance(v, torch.Tensor) and v.device.type == "cpu"
    )
    base = None
    try:
        stats = os.statvfs("/dev/shm")
        if stats.f_bavail * stats.f_frsize > 2 * need + (64 << 20):
            base = "/dev/shm"
    except OSError:
        pass
    return tempfile.mkdtemp(prefix="fibgen-lent-", dir=base)


class SolutionProcess:
    """A fresh process that runs one solution for the judge (Note [isolated solutions])."""

    def __init__(self, device: torch.device) -> None:
        context = fork_server(str(device))
        parent, end = context.Pipe()
        self.process = context.Process(
            target=solution_main, args=(end, str(device), os.getpid()), daemon=True
        )
        try:
            self.process.start()
        finally:
            end.close()
        self.conn = parent
        self.device = device
        self.folder: str | None = None

    def kill(self) -> None:
        """End the process (if it is not gone already) and free what was lent to it."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def run(self, judge: w.Worker, run: m.Run) -> m.Result | m.TimedOut | m.Died | m.Failed:
        """Run a solution in this process, judged by ``judge``; the reply for the runner."""
        try:
            return self._run(judge, run)
        except (EOFError, OSError):
            return m.Died(death_of(self.process))
        except _Broken as exc:
            return m.Died(
                f"the solution's process broke bench's protocol ({exc}); a solution must not "
                "change bench's code"
            )

    def _run(self, judge: w.Worker, run: m.Run) -> m.Result | m.TimedOut | m.Died | m.Failed:
        started = _receive(self.conn, START_TIMEOUT)
        if started is None:
            return m.Died(f"worker process did not start within {START_TIMEOUT:g} s")
        if started[0].get("kind") != "ready":
            return m.Failed(str(started[0].get("log", "the solution's process did not start")))
        work = judge.prepared
        self.folder = _shared_folder(work.inputs)
        lent, sent = _lend(work.inputs, self.folder)
        expected = [(list(e.shape), str(e.dtype).removeprefix("torch.")) for e in work.expected]
        self.conn.send(m.Take(work.definition, sent, expected))
        self.conn.send(run)
        unlinked = False
        begun = time.monotonic()
        deadline = begun + run.limit_s
        sampler = w.definition_is_sampling(work.definition)
        tolerance = run.tolerance
        verdicts: list[tuple[str, dict | None, dict]] = []
        while True:
            got = _receive(self.conn, deadline - time.monotonic())
            if got is None:
                return m.TimedOut()
            message, frames = got
            if not unlinked:
                # Both processes map the lent files by now (the solution process says so
                # before it runs anything): their names can go, so that nothing is left in
                # /dev/shm by a worker killed later.
                shutil.rmtree(self.folder, ignore_errors=True)
                unlinked = True
            kind = message.get("kind")
            if kind == "taken":
                continue
            if kind == "check":
                actual = _parsed(_outputs, message, frames, judge.device)
                mutation = bool(message.get("inputs"))
                values = bool(message.get("values"))
                problem, errors = judge.check_outputs(
                    actual, tolerance, values=values, inputs=lent if mutation else None
                )
                verdicts.append(("first" if mutation else "again", problem, errors))
                self.conn.send(m.Verdict(problem, errors))
            elif kind == "sampler":
                spent = time.monotonic() - begun
                try:
                    problem, errors = judge.judge_sampler(
                        lambda inputs: self._draw(inputs, work.inputs, deadline),
                        spent,
                        run.limit_s,
                    )
                except _OutOfTime:
                    return m.TimedOut()
                except _Raised as exc:
                    problem, errors = {"status": w.RUNTIME_ERROR, "log": str(exc)}, {}
                verdicts.append(("sampler", problem, errors))
                self.conn.send(m.Verdict(problem, errors))
            elif kind == "result":
                return m.Result(_parsed(_reconciled, message.get("result"), verdicts, sampler))
            elif kind == "error":
                return m.Failed(str(message.get("log", "")))
            else:
                raise _Broken(f"unknown message {kind!r}")

    def _draw(self, inputs: dict[str, Any], base: dict[str, Any], deadline: float) -> Any:
        """A sampler's draws on ``inputs`` (the workload's rows repeated), made by the
        solution process on the inputs it holds; for ``compare_sampling``."""
        times = inputs["probs"].shape[0] // max(1, base["probs"].shape[0])
        self.conn.send(m.Draw(times))
        got = _receive(self.conn, deadline - time.monotonic())
        if got is None:
            raise _OutOfTime()
        message, frames = got
        if message.get("kind") == "raised":
            raise _Raised(str(message.get("log", "")))
        if message.get("kind") != "samples":
            raise _Broken(f"unknown message {message.get('kind')!r}")
        return _parsed(lambda: _tensor(message["tensor"], frames[0], torch.device("cpu")))


class _OutOfTime(Exception):
    pass


class _Raised(Exception):
    """A sampler that raised in its process while drawing; the text is its traceback."""


_STATUSES = {
    w.PASSED,
    w.INCORRECT_SHAPE,
    w.INCORRECT_DTYPE,
    w.INCORRECT_NUMERICAL,
    w.RUNTIME_ERROR,
    w.COMPILE_ERROR,
    w.TIMEOUT,
}
_TIMING_KEYS = ("median_ms", "q1_ms", "q3_ms", "samples", "calls_per_sample")


def _reconciled(result: Any, verdicts: list, sampler: bool) -> dict:
    """The evaluation a solution process reported, held to the judge's verdicts (Note
    [isolated solutions]): a failure the judge found stands, and a PASSED needs every check
    passed by the judge."""
    if not isinstance(result, dict) or result.get("status") not in _STATUSES:
        raise ValueError("a result without a known status")
    # Not "fatal": a CUDA error broke the solution process's context, not the judge's.
    result = {k: result[k] for k in ("status", "log", "timing") if k in result}
    if "log" in result and not isinstance(result["log"], str):
        raise ValueError("a log that is no text")
    for _, problem, _ in verdicts:
        if problem is not None:
            # The solution process words it (after timing, say); the judge's verdict stands.
            if result["status"] == problem["status"] and "log" in result:
                return {**problem, "log": result["log"]}
            return problem
    if result["status"] != w.PASSED:
        return result
    made = [kind for kind, _, _ in verdicts]
    needed = ["first", "sampler"] if sampler else ["first", "again"]
    if made[:2] != needed or len(made) != 2:
        return {
            "status": w.RUNTIME_ERROR,
            "log": "the solution's process reported PASSED, but bench's checks of its outputs "
            f"were not made as they are ({', '.join(made) or 'none'} of "
            f"{', '.join(needed)}); a solution must not change bench's code",
        }
    timing = result.get("timing")
    if not isinstance(timing, dict) or not all(
        isinstance(timing.get(k), (int, float)) for k in _TIMING_KEYS
    ):
        raise ValueError("a PASSED result without its timing")
    result["correctness"] = verdicts[-1][2] if sampler else verdicts[0][2]
    return result


# ---------------------------------------------------------------------------------------
# The solution process's side


class InSolutionProcess(w.Worker):
    """``Worker.evaluate`` in a solution process, whose checks the judge makes."""

    def __init__(self, device: str, conn: Any) -> None:
        super().__init__(device)
        self.conn = conn

    def take(self, take: m.Take) -> None:
        """The workload the judge prepared, its inputs lent (``_lend``)."""
        inputs = _borrowed(take.sent, self.device)
        # Shapes and dtypes only: the reference's values stay with the judge. Its code is
        # here as in the worker, for whatever ``evaluate`` times beside the solution; the
        # verdicts use the judge's outputs alone.
        specs = tuple(torch.empty(s, dtype=_dtype(d), device="meta") for s, d in take.expected)
        self.work = w.WorkloadInputs(take.definition, inputs, specs, device=self.device)
        self.reference = w.load_reference(take.definition)

    def _call_inputs(self) -> dict[str, Any]:
        # The judge's lent copies themselves: it reads what the call did to them.
        return dict(self.prepared.inputs)

    def check_outputs(
        self, actual: tuple, tolerance: dict, values: bool = True, inputs: Any = None
    ) -> tuple[dict | None, dict]:
        fields, frames = _outputs_message(actual)
        _send(
            self.conn,
            {"kind": "check", "values": values, "inputs": inputs is not None, **fields},
            frames,
        )
        verdict: m.Verdict = self.conn.recv()
        return verdict.problem, verdict.errors

    def _check_sampler(
        self, loaded: Any, started: float, limit_s: float | None
    ) -> tuple[dict | None, dict]:
        inputs = self.prepared.inputs
        _send(self.conn, {"kind": "sampler"})
        while True:
            request: m.Verdict | m.Draw = self.conn.recv()
            if isinstance(request, m.Verdict):
                return request.problem, request.errors
            try:
                samples = self._draw(loaded, inputs, request.times)
            except Exception as exc:
                _send(self.conn, {"kind": "raised", "log": w.tail(w.format(exc))})
                continue
            header, data = _tensor_bytes(samples)
            _send(self.conn, {"kind": "samples", "tensor": header}, (data,))

    def _draw(self, loaded: Any, inputs: dict[str, Any], times: int) -> torch.Tensor:
        from fibgen.runtime.checking.compare import repeated_inputs
        from fibgen.runtime.solutions.loading import allocate_outputs

        args = repeated_inputs(inputs, times)
        if loaded.dps:
            outputs = allocate_outputs(self.prepared.definition, args)
            loaded.fn(**args, **outputs)
            value = next(iter(outputs.values()))
        else:
            value = w.as_tuple(loaded.fn(**args))[0]
        return torch.as_tensor(value).detach().to("cpu").flatten().to(torch.int64)


def serve(conn: Any, device: str) -> None:
    """A solution process: take the workload, run the solution, report, and end."""
    # Stopped by its judge, never by the Ctrl-C meant for the runner.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        process = InSolutionProcess(device, conn)
    except Exception as exc:
        _send(conn, {"kind": "broken", "log": f"cannot run on device {device}: {exc}"})
        return
    _send(conn, {"kind": "ready"})
    try:
        while True:
            request = conn.recv()
            if isinstance(request, m.Take):
                process.take(request)
                _send(conn, {"kind": "taken"})  # the lent inputs are mapped here now
            elif isinstance(request, m.Run):
                result = process.evaluate(request)
                _send(conn, {"kind": "result", "result": result})
                return
            else:
                return
    except EOFError:
        return
    except Exception as exc:
        _send(conn, {"kind": "error", "log": w.tail(w.format(exc))})


def solution_main(conn: Any, device: str, worker: int) -> None:
    """Run one solution for the worker that judges it (Note [isolated solutions] in
    this module); end when that worker, or the fork server that started this process, does.

    multiprocessing's fork server outlives every process it forked (each holds the write end
    of a pipe the server reads, so the server sees no end of file while one lives), and a
    process it forked gets its death signal only when the server dies: a solution that hangs
    would keep both alive after the worker was killed. So this process lets go of that pipe,
    and its watchdog also watches the worker itself.
    """
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if server is not None and isinstance(fd, int):
        os.close(fd)
        server._forkserver_alive_fd = None
    die_with_parent(os.getppid(), also=worker)
    serve(conn, device)
