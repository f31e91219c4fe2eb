"""Replaying a Triton solution's launches for calls like those it has made (Note [launch replay]).

Note [launch replay]
~~~~~~~~~~~~~~~~~~~~
A routed call of a small kernel costs what the CPU does before the launch: the solution's
own Python (shapes, strides, a grid, a plan), Triton's keying of the launch, then the launch
itself. On an H100 host a 1-row rmsnorm of the shipped Triton solution cost 16 µs through
the solution and its accelerated kernel (Note [triton launch]) against 5 µs for the compiled
kernel's launcher alone, and FlashInfer's own rmsnorm 11 to 15 µs.

For a call of the same *layout* as earlier ones (the shape, strides, 16-byte alignment and
device of every tensor, the value of every other argument, which tensors are the same
buffer, the current device) a solution that only launches Triton kernels makes the same
launches again: the same kernels with the same grids and the same scalars, on the call's own
tensors. ``wrap`` keeps them per layout and launches them directly, with the new addresses.

What makes a layout replayable, checked where its launches are recorded:

- every launch went through the fast launch of a kernel fibgen accelerated (a launch
  through Triton's own run, or a kernel reading globals, is not recorded);
- no torch operation ran other than views (a ``TorchDispatchMode`` sees every aten op: an
  allocation, a copy, a computation, a ``.item()`` that could make the launches depend on
  values); the launches were on the current stream, and every tensor address a launch took
  is the address of one of the call's tensors, all contiguous;
- two calls of the layout recorded the same launches (a solution whose launches depend on
  anything but the layout, such as a counter, shows it here);
- replaying the launches on copies of the tensors as they were before the second call gave
  the same bytes in every tensor as the call itself: the launches are the call's whole effect.

A layout that fails any of these is called normally from then on; so are calls during CUDA
graph capture whose layout is not replayable yet (recording synchronizes), layouts with an
address that is not 16-byte aligned (Triton specializes on alignment), layouts whose tensors
hold more than ``_MAX_VERIFY_BYTES`` (the copies would cost memory; launch cost does not
matter at such sizes) and layouts beyond ``_MAX_LAYOUTS`` per solution. Replays are made only
while Triton's launch hooks are empty (a profiler's hooks would otherwise miss them).

The call itself is the hot path: reading a layout through Python's tensor attributes costs
about 0.45 µs per tensor, a third of a 1-row rmsnorm's launch. ``_native.cpp`` reads it in
C++ (about 15 ns per tensor) and launches from there. It is built once per machine with
torch's extension builder (``builders.build_extension``, cached like solution builds), in a
background thread started by the first wrapped solution; until it is ready, or where it
cannot be built (no C++ compiler), the same tables are kept in Python. ``FIBGEN_REPLAY``:
``native`` (default), ``python`` (never build) or ``off`` (no replay);
``FIBGEN_TRITON_LAUNCH=triton`` turns the fast launch, and with it replay, off.
"""

from __future__ import annotations

import functools
import inspect
import keyword
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.utils._python_dispatch

from fibgen.runtime.launch import fast as launch
from fibgen.runtime.launch.native import build_native

_MAX_LAYOUTS = 4096
_MAX_VERIFY_BYTES = 256 << 20

# The integer dtype of each element size, to compare tensors bit for bit (NaN included).
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def mode() -> str:
    """``FIBGEN_REPLAY``: native, python or off."""
    value = os.environ.get("FIBGEN_REPLAY", "native").strip().lower()
    return value if value in ("native", "python", "off") else "native"


def _safe_names(names: Sequence[str]) -> bool:
    return all(
        n.isidentifier() and not keyword.iskeyword(n) and not n.startswith("_") for n in names
    )


def wrap(fn: Callable[..., Any], names: Sequence[str], scalars: Iterable[str] = ()) -> Any:
    """``fn``, a destination-passing solution called with ``names`` (and maybe ``inplace``),
    with its launches replayed for layouts seen before (Note [launch replay]). ``scalars``
    are the names whose values are not tensors."""
    names = tuple(names)
    scalars = frozenset(scalars)
    if mode() == "off" or not names or not _safe_names(names) or all(n in scalars for n in names):
        return fn
    return Replayer(fn, names, tuple(n not in scalars for n in names)).call


class Replayer:
    """The per-layout launches of one solution, and the call that uses them."""

    def __init__(self, fn: Callable[..., Any], names: tuple[str, ...], tensors: tuple) -> None:
        self.fn = fn
        self.names = names
        self.inplace = _inplace_default(fn)
        self.tensors = tensors + ((False,) if self.inplace is not None else ())
        self.never: set = set()  # layouts called normally
        self.pending: dict[Any, tuple] = {}  # layout -> launches recorded once
        self.lock = threading.Lock()
        self.call, self.namespace = self._make_call()
        self.table: Any = None
        native = _native(start=mode() == "native", waiting=self)
        self.use(native.Table(stream_of, _hook_chains()) if native else _PyTable(self.tensors))

    def use(self, table: Any) -> None:
        """Keep layouts in ``table`` from now on (what was kept before is recorded again)."""
        with self.lock:
            self.table = table
            self.never.clear()
            self.pending.clear()
            self.namespace["_run"] = table.run

    def _make_call(self) -> tuple[Callable[..., Any], dict]:
        params = list(self.names)
        args = ", ".join(self.names)
        if self.inplace is not None:
            params.append("inplace=_INPLACE")
            args += ", inplace"
        body = [
            f"def call({', '.join(params)}):",
            f"    if _run({args}):",
            "        return None",
            f"    return _slow({args})",
        ]
        namespace: dict[str, Any] = {"_slow": self._slow, "_INPLACE": self.inplace}
        # Generated from identifier names only (checked by ``_safe_names``).
        exec("\n".join(body) + "\n", namespace)  # noqa: S102
        call = namespace["call"]
        # Messages and signature checks see the solution itself.
        functools.update_wrapper(call, self.fn)
        return call, namespace

    def _slow(self, *values: Any) -> Any:
        """A call whose layout has no launches to replay: call the solution, and record."""
        kwargs = dict(zip(self.names, values))
        if self.inplace is not None:
            kwargs["inplace"] = values[-1]
        table = self.table
        key = table.layout(*values)
        if key is None or key in self.never or not self._may_record():
            return self.fn(**kwargs)
        state = _snapshot(values) if key in self.pending else None
        launches, why = _record(self.fn, kwargs)
        if why is _AGAIN:
            return None
        # The plan, or None where the launches cannot be replayed (why, or _plan's reason).
        plan: tuple | None = None
        if why is None:
            made = _plan(launches, values)
            plan = None if isinstance(made, str) else made
        with self.lock:
            if table is not self.table:
                return None  # the tables changed meanwhile: the next call records anew
            if plan is None:
                self.never.add(key)
            elif key not in self.pending:
                self.pending[key] = plan
            else:
                first = self.pending.pop(key)
                if first != plan or state is None or not _verified(plan, state, values):
                    self.never.add(key)
                else:
                    device, launches = plan
                    table.set(key, device, _launch_tuples(launches))
        return None

    def _may_record(self) -> bool:
        """Not in capture (recording synchronizes), not past the table's size, not while
        launch hooks are set."""
        from fibgen.runtime.launch.capture import is_capturing

        size = self.table.size() + len(self.pending) + len(self.never)
        return size < _MAX_LAYOUTS and not is_capturing() and not _hooks_set()


def _inplace_default(fn: Callable[..., Any]) -> Any:
    """The default of ``fn``'s ``inplace`` parameter, or None where it has none."""
    try:
        param = inspect.signature(fn).parameters.get("inplace")
    except (TypeError, ValueError):
        return None
    if param is None or param.default is inspect.Parameter.empty:
        return None
    return param.default


def _no_device() -> int:
    return -1  # a CPU tensor's get_device()


def _no_stream(device: int) -> int:
    return 0


# The current device and a device's current stream, as the fast launch asks for them.
device_now: Callable[[], int] = getattr(torch._C, "_cuda_getDevice", None) or _no_device
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _no_stream


def stream_of(device: int) -> int:
    """The current stream of ``device``, as the fast launch passes it to a launcher."""
    return _raw_stream(device)


_HOOK_CHAINS: tuple | None = None


def _hook_chains() -> tuple:
    """Triton's launch hook chains (``calls`` is the list a profiler adds to), or ()."""
    global _HOOK_CHAINS
    if _HOOK_CHAINS is None:
        try:
            from triton import knobs

            chains = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
            _HOOK_CHAINS = chains if all(isinstance(c.calls, list) for c in chains) else ()
        except Exception:  # a Triton without hook chains: the fast launch decides per launch
            _HOOK_CHAINS = ()
    return _HOOK_CHAINS


def _hooks_set() -> bool:
    """Whether Triton's launch hooks have callers (a replayed launch would skip them)."""
    return any(c.calls for c in _hook_chains())


# ---------------------------------------------------------------------------- the tables


class _PyTable:
    """The layouts of one solution kept in Python, where the C++ table is not there (yet)."""

    def __init__(self, tensors: tuple[bool, ...]) -> None:
        self.plans: dict[tuple, Callable[..., None]] = {}
        self.tensors = sum(tensors)
        self.run, self.layout = _py_functions(tensors, self.plans)

    def set(self, key: tuple, device: int, launches: list) -> None:
        self.plans[key] = _replayer(device, launches, self.tensors)

    def size(self) -> int:
        return len(self.plans)


def _py_functions(tensors: tuple[bool, ...], plans: dict) -> tuple[Callable, Callable]:
    """``run`` and ``layout`` in straight-line Python for arguments of these kinds."""
    params = [f"_v{i}" for i in range(len(tensors))]
    lines, key, ptrs = [], [], []
    for i, is_tensor in enumerate(tensors):
        if is_tensor:
            lines.append(f"    _p{i} = _v{i}.data_ptr()")
            key.append(f"_v{i}.dtype, _v{i}.get_device(), _v{i}.shape, _v{i}.stride()")
            ptrs.append(f"_p{i}")
        else:
            key.append(f"type(_v{i}), _v{i}")
    pointers = ", ".join(ptrs) + ","
    # Which tensors are the same buffer is part of the layout: it says which tensor a
    # recorded address stands for. Misaligned layouts have none (Note [launch replay]).
    alias = f"None if len({{{pointers}}}) == {len(ptrs)} else _aliases(({pointers}))"
    layout = [f"def layout({', '.join(params)}):", "  try:"]
    layout += [f"  {line}" for line in lines]
    layout += [
        f"      if ({' | '.join(ptrs)}) & 15:",
        "          return None",
        f"      return ({', '.join(key)}, {alias})",
        "  except Exception:",
        "      return None",
    ]
    run = [
        f"def run({', '.join(params)}):",
        "  try:",
        *[f"  {line}" for line in lines],
        f"      _key = None if ({' | '.join(ptrs)}) & 15 else ({', '.join(key)}, {alias})",
        "      _replay = _plans.get(_key)",
        "  except Exception:",
        "      return False",
        "  if _replay is None or _hooks_set():",
        "      return False",
        f"  _replay({', '.join(ptrs)})",
        "  return True",
    ]
    namespace = {"_plans": plans, "_aliases": _aliases, "_hooks_set": _hooks_set}
    # Generated from positions only.
    exec("\n".join(layout + run) + "\n", namespace)  # noqa: S102
    run_fn: Callable[..., Any] = namespace["run"]  # type: ignore[assignment]
    layout_fn: Callable[..., Any] = namespace["layout"]  # type: ignore[assignment]
    return run_fn, layout_fn


def _aliases(addresses: tuple) -> tuple:
    """Which of the addresses are the same: the index of each one's first occurrence."""
    return tuple(map(addresses.index, addresses))


_native_state: dict[str, Any] = {}
_native_lock = threading.Lock()
_waiting: list[Replayer] = []  # replayers on Python tables until the C++ table is built


def _native(start: bool, waiting: Replayer) -> Any:
    """The built C++ module, or None; ``start`` builds it in the background where a GPU is
    (the only place launches are replayed), and ``waiting`` then switches to it when built."""
    module = _native_state.get("module")
    if module is not None or not start:
        return module
    with _native_lock:
        if "thread" not in _native_state and torch.cuda.is_available():
            thread = threading.Thread(target=_build_native, name="fibgen-replay-build", daemon=True)
            _native_state["thread"] = thread
            thread.start()
        if _native_state.get("thread") is not None and "module" not in _native_state:
            _waiting.append(waiting)
    return _native_state.get("module")


def wait_native(strict: bool = False) -> None:
    """Wait for the builds of the extension module started in the background, if any
    (benchmarks time the path a settled process takes). ``strict``: raise RuntimeError if
    launch replay was left on its Python tables because the C++ part failed to build (a
    benchmark of routed calls would time a path no settled process takes)."""
    thread = _native_state.get("thread")
    if thread is not None:
        thread.join()
    from fibgen.runtime.checking import result_check  # the same module, built from another thread

    result_check.wait()
    problem = native_problem()
    if strict and problem is not None:
        raise RuntimeError(problem)


def native_problem() -> str | None:
    """Why launch replay keeps its tables in Python although it tried to build its C++ part,
    or None (built, building, or never needed here)."""
    return _native_state.get("problem")


def _build_native() -> None:
    try:
        module = build_native()
    except Exception as exc:  # no compiler, no headers: the Python tables stay
        problem = (
            f"fibgen: launch replay keeps its tables in Python: its C++ part did not build "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        )
        _native_state["problem"] = problem
        warnings.warn(problem, RuntimeWarning, stacklevel=1)
        return
    with _native_lock:
        _native_state["module"] = module
        waiting = list(_waiting)
        _waiting.clear()
    for replayer in waiting:
        replayer.use(module.Table(stream_of, _hook_chains()))


# ---------------------------------------------------------------------------- recording


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """Notes the first torch operation that is not a view."""

    def __init__(self) -> None:
        super().__init__()
        self.other: str | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.other is None and not func.is_view:
            self.other = str(func)
        return func(*args, **(kwargs or {}))


_AGAIN = object()  # a call not to record, but whose layout a later call may be


def _record(fn: Callable[..., Any], kwargs: dict) -> tuple[list, Any]:
    """Call ``fn`` recording its launches: (launches, why they cannot be replayed, or None,
    or ``_AGAIN``)."""
    ops = _Ops()
    launches = launch.start_recording()
    try:
        with ops:
            result = fn(**kwargs)
    finally:
        launch.stop_recording()
    # A kernel's first call (Triton compiles, an autotuner times its configurations) says
    # nothing of the calls after it.
    if any(isinstance(item, str) and item in launch.PASSING for item in launches):
        return launches, _AGAIN
    if result is not None:
        return launches, "it returned a value"
    if ops.other is not None:
        return launches, f"it ran {ops.other}"
    for item in launches:
        if isinstance(item, str):
            return launches, item
    if not launches:
        return launches, "it launched nothing"
    return launches, None


_ARG = object()  # marks a tensor address in a plan's launch arguments


def _plan(launches: list, values: tuple) -> tuple | str:
    """(device, launches) with each tensor address replaced by ``(_ARG, j)``, the address
    of the call's ``j``-th tensor; or why that cannot be done."""
    device = device_now()
    stream = stream_of(device)
    addresses: dict[int, int] = {}
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    for j, v in enumerate(tensors):
        if not v.is_contiguous():
            return "a tensor is not contiguous"
        if v.get_device() != device:
            return "a tensor is not on the current device"
        addresses.setdefault(v.data_ptr(), j)
    plan = []
    for launcher, grid, launch_stream, head, args, tail, pointers in launches:
        if launch_stream != stream:
            return "it launched on another stream"
        if len(grid) != 3:  # the fast launch records (x, y, z); the C++ table takes three
            return f"a launch's grid has {len(grid)} dimensions, not 3"
        args = list(args)
        for position in pointers:
            index = addresses.get(args[position])
            if index is None:
                return "a launch took an address that is none of the call's tensors"
            args[position] = (_ARG, index)
        plan.append((launcher, tuple(grid), head, tuple(args), tail))
    return device, tuple(plan)


def _launch_tuples(launches: tuple) -> list:
    """A plan's launches as the C++ table takes them: (launcher, arguments, pointer slots),
    the arguments with None where the stream and the addresses go."""
    out = []
    for launcher, grid, head, args, tail in launches:
        full = [*grid, None, *head]
        slots = []
        for arg in args:
            if isinstance(arg, tuple) and len(arg) == 2 and arg[0] is _ARG:
                slots.append((len(full), arg[1]))
                full.append(None)
            else:
                full.append(arg)
        out.append((launcher, tuple(full + list(tail)), tuple(slots)))
    return out


def _snapshot(values: tuple) -> list | None:
    """Copies of the call's tensors before the call, or None where they are too large."""
    total = sum(v.nbytes for v in values if isinstance(v, torch.Tensor))
    if total > _MAX_VERIFY_BYTES:
        return None
    copies: dict[int, torch.Tensor] = {}
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            # One copy per buffer, so that aliases stay aliases.
            copy = copies.get(v.data_ptr())
            if copy is None:
                copy = copies[v.data_ptr()] = v.clone()
            out.append(copy)
        else:
            out.append(v)
    return out


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same bytes (NaN equal to the same NaN)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    bits = _BITS.get(a.element_size())
    if bits is not None and a.dtype != bits and not a.dtype.is_complex:
        a, b = a.view(bits), b.view(bits)
    return bool(torch.equal(a, b))


def _verified(plan: tuple, state: list, values: tuple) -> bool:
    """Whether replaying ``plan`` on ``state`` (copies from before the call) leaves every
    tensor exactly as the call left the real ones."""
    device, launches = plan
    addresses = [v.data_ptr() for v in state if isinstance(v, torch.Tensor)]
    _replayer(device, _launch_tuples(launches), len(addresses))(*addresses)
    return all(
        _same_bits(copy, real)
        for copy, real in zip(state, values)
        if isinstance(real, torch.Tensor)
    )


def _replayer(device: int, launches: list, count: int) -> Callable[..., None]:
    """Straight-line Python making ``launches`` (as ``_launch_tuples`` gives them); it
    takes the addresses of the call's ``count`` tensors, in order."""
    namespace: dict[str, Any] = {"_stream_of": stream_of, "_device": device}
    lines = [f"def replay({', '.join(f'_a{j}' for j in range(count))}):"]
    lines.append("    _s = _stream_of(_device)")
    for i, (launcher, args, slots) in enumerate(launches):
        namespace[f"_L{i}"] = launcher
        filled = dict(slots)
        parts = []
        for k, arg in enumerate(args):
            if k == 3:
                parts.append("_s")
            elif k in filled:
                parts.append(f"_a{filled[k]}")
            else:
                namespace[f"_c{i}_{k}"] = arg
                parts.append(f"_c{i}_{k}")
        lines.append(f"    _L{i}({', '.join(parts)})")
    # Generated from positions only; every value is bound in the namespace.
    exec("\n".join(lines) + "\n", namespace)  # noqa: S102
    return namespace["replay"]
