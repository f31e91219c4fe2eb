"""Launching Triton kernels without Triton's per-call Python work (Note [triton launch]).

Note [triton launch]
~~~~~~~~~~~~~~~~~~~~
``kernel[grid](*args)`` goes through ``JITFunction.run`` on every call: it binds the arguments,
computes Triton's specialization of each one, builds a cache key of those and of
``str(options)``, finds the compiled kernel, evaluates the grid, builds launch metadata and
finally calls the compiled kernel's launcher. On an H100 host with Triton 3.6 the whole costs
19.5 µs per launch, the launcher alone 7.1 µs: in an eager decode loop a routed 1-row rmsnorm
was 3.6 times slower than the call it replaced, for the launch and not the kernel.

``accelerate(kernel)`` gives one ``JITFunction`` object a ``run`` of its own that keeps the
compiled kernel of each specialization and launches it directly. What decides Triton's
specialization of an argument is small and known: a tensor's dtype and whether its address is
a multiple of 16; an int's type (bool, int), whether it equals 1, whether it is a multiple of
16 and its range (i32, i64, u64); the type of a float, bool or None; a constexpr's value; the
options (``num_warps``...), the current device and the debug and instrumentation knobs. A key
of exactly these, computed by straight-line code generated for the kernel's signature and the
call's shape, is at least as fine as Triton's own: two calls with the same key get the same
compiled kernel. ``tests/test_launch.py`` checks that against Triton's own
``native_specialize_impl`` over every kind of argument, and ``FIBGEN_CHECK_LAUNCH=1`` checks
every cached launch against Triton's binder on a GPU.

A key not seen yet goes through Triton's own ``run``, which compiles (or finds) the kernel and
launches it; the compiled kernel is then kept under the key. Calls that the key does not cover
always go through Triton's ``run``, so they stay correct: ``warmup``, pre-run hooks, launch
hooks (a profiler such as proton adds to Triton's hook chains), runtime arguments passed by keyword, arguments of other
kinds (tuples, tensor descriptors), unhashable constexprs, an asynchronous compile, and more
than ``_MAX_ENTRIES`` specializations of one kernel.

The solution loader accelerates the kernels a Triton solution defines (module globals of the
solution's own package); ``FIBGEN_TRITON_LAUNCH=triton`` turns that off. Under
``TRITON_INTERPRET=1`` kernels are interpreted and nothing is changed.
"""

from __future__ import annotations

import functools
import inspect
import keyword
import os
import sys
import threading
from types import ModuleType
from typing import Any

# Specializations kept per kernel, and key plans per call shape; beyond, Triton launches.
_MAX_ENTRIES = 1 << 16
_MAX_PLANS = 4
_lock = threading.Lock()

# Launch recording for replay (Note [launch replay] in replay.py): the number of threads
# recording now, read by every fast launch, and each recording thread's list of launches.
recording = 0
_recorded = threading.local()


def start_recording() -> list:
    """Record this thread's launches until ``stop_recording``; returns the list they go to.

    A fast launch appends ``(launcher, grid, stream, head, args, tail, pointers)``, where
    ``pointers`` are the positions in ``args`` of tensor addresses; a launch that went
    through Triton instead (or any other reason the calls cannot be replayed) appends a
    string saying why.
    """
    global recording
    launches: list = []
    with _lock:
        _recorded.launches = launches
        recording += 1
    return launches


def stop_recording() -> None:
    """End this thread's recording."""
    global recording
    with _lock:
        if getattr(_recorded, "launches", None) is not None:
            _recorded.launches = None
            recording -= 1


# Reasons a recorded launch went through Triton that a later call of the same layout will
# not have: the kernel's first call with a key compiles it.
FIRST_CALL = "its first call with this key"
HOOKS_SET = "launch hooks are set"
PASSING = frozenset((FIRST_CALL, HOOKS_SET))


def note(item: Any) -> None:
    """Add ``item`` to this thread's recording, if it is recording."""
    launches = getattr(_recorded, "launches", None)
    if launches is not None:
        launches.append(item)


def enabled() -> bool:
    """Whether the solution loader accelerates Triton kernels (``FIBGEN_TRITON_LAUNCH``)."""
    return os.environ.get("FIBGEN_TRITON_LAUNCH", "fibgen").strip().lower() != "triton"


def _jit_function_type() -> type | None:
    if "triton" not in sys.modules:
        # Nothing imported can be a Triton kernel, and importing Triton here would fix its
        # interpreter switch off for the process (Note [Triton without a GPU] in solutions.py).
        return None
    try:
        from triton.runtime.jit import JITFunction
    except Exception:  # triton missing or broken: nothing to accelerate
        return None
    return JITFunction


def _innermost(kernel: Any) -> Any:
    """The JITFunction an Autotuner or Heuristics object launches through (or ``kernel``)."""
    jit = _jit_function_type()
    inner = kernel
    while jit is not None and not isinstance(inner, jit) and hasattr(inner, "fn"):
        inner = inner.fn
    return inner


def _accelerable(inner: Any) -> bool:
    jit = _jit_function_type()
    # Interpreted kernels (TRITON_INTERPRET=1) are not JITFunctions.
    return jit is not None and isinstance(inner, jit) and hasattr(inner, "device_caches")


def accelerate(kernel: Any) -> Any:
    """Give ``kernel`` (a ``@triton.jit`` function, or an autotuner around one) the fast launch.

    Returns ``kernel``. Interpreted kernels (``TRITON_INTERPRET=1``) and objects that are not
    Triton kernels are returned unchanged; accelerating twice changes nothing.
    """
    inner = _innermost(kernel)
    if _accelerable(inner):
        with _lock:
            if not isinstance(inner.__dict__.get("run"), FastRun):
                inner.run = FastRun(inner)
                # `kernel[grid]` then returns the fast launch bound to the grid, without the
                # lambda and the repacked keywords of KernelInterface.__getitem__.
                inner.__class__ = _fast_class(type(inner))
    return kernel


_FAST_CLASSES: dict[type, type] = {}


def _fast_class(base: type) -> type:
    """A subclass of ``base`` (JITFunction) whose ``kernel[grid]`` is FastRun.launch."""
    cls = _FAST_CLASSES.get(base)
    if cls is None:

        def __getitem__(self: Any, grid: Any) -> Any:
            return functools.partial(self.__dict__["run"].launch, grid)

        cls = type(
            base.__name__,
            (base,),
            {"__getitem__": __getitem__, "__module__": base.__module__, "_fibgen_base": base},
        )
        _FAST_CLASSES[base] = cls
    return cls


def accelerated(kernel: Any) -> FastRun | None:
    """The fast run of an accelerated kernel, or None."""
    run = getattr(_innermost(kernel), "__dict__", {}).get("run")
    return run if isinstance(run, FastRun) else None


def restore(kernel: Any) -> None:
    """Undo ``accelerate``: launches go through Triton's own run again."""
    if accelerated(kernel) is not None:
        inner = _innermost(kernel)
        with _lock:
            del inner.run
            inner.__class__ = type(inner)._fibgen_base


def accelerate_modules(modules: list[ModuleType], package: str) -> int:
    """Accelerate the Triton kernels that ``modules`` define in ``package``; their count.

    Kernels imported from elsewhere (a library's) are left as they are: they may be shared.
    """
    if not enabled() or _jit_function_type() is None:
        return 0
    count = 0
    for module in modules:
        for value in list(vars(module).values()):
            inner = _innermost(value)
            owner = getattr(getattr(inner, "fn", None), "__module__", None) or ""
            if owner != package and not owner.startswith(package + "."):
                continue
            if _accelerable(inner):
                accelerate(value)
                count += 1
    return count


class _Plan:
    """How calls of one shape (positional count, keyword names) and argument kinds are keyed.

    ``key`` is generated straight-line code: guards that raise for an argument of another
    kind than the call the plan was made from, then one tuple of what Triton specializes on.
    """

    __slots__ = ("key", "names", "entries")

    def __init__(self, fn: Any, nargs: int, kwnames: tuple[str, ...], args: tuple) -> None:
        params = fn.params
        self.names = [p.name for p in params]
        self.key = _key_function(params, nargs, kwnames, args)
        self.entries: dict[tuple, _Entry] = {}


def _key_function(params: list, nargs: int, kwnames: tuple[str, ...], args: tuple) -> Any:
    """The generated key function of a call shape, or None where Triton must key the call.

    ``key(device, base, *args, **constexprs)`` returns the cache key (``base`` and the
    device in it) and the launch arguments: the
    positional arguments with each tensor replaced by its address. It raises for an
    argument of another kind than the call it was made from, and for a tensor on another
    device than the current one, whose address Triton's launcher would check.
    """
    if nargs > len(params):
        return None
    by_name = {p.name: p for p in params}
    for name in kwnames:
        if name in by_name and not by_name[name].is_constexpr:
            return None  # a runtime argument by keyword: its value would have to be keyed
        if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
            return None
        if name in [p.name for p in params[:nargs]]:
            return None  # given twice: Triton reports it
    guards, parts, lets, out, pointers = [], [], [], [], []
    for i, (p, a) in enumerate(zip(params, args)):
        name = f"_{i}"
        if p.is_constexpr:
            parts.append(name)
            out.append(name)
        elif _is_tensor(a):
            # Ints, floats and None have no data_ptr; other objects no get_device: they fail.
            lets.append(f"_p{i} = {name}.data_ptr()")
            guards.append(f"{name}.get_device() != _device")
            parts.append(f"{name}.dtype")
            if not p.do_not_specialize_on_alignment:
                parts.append(f"not _p{i} & 15")
            pointers.append(len(out))
            out.append(f"_p{i}")
        elif type(a) is int:
            # The value itself: what Triton specializes on (== 1, multiple of 16, range)
            # is a function of it; repeated sizes and strides hit one entry.
            guards.append(f"type({name}) is not int")
            parts.append(name)
            out.append(name)
        elif a is None:
            guards.append(f"{name} is not None")
            out.append(name)
        elif type(a) in (float, bool):
            guards.append(f"type({name}) is not {type(a).__name__}")
            out.append(name)
        else:
            return None  # tuples, tensor descriptors, other objects: Triton keys them
    signature = ["_device", "_base"] + [f"_{i}" for i in range(nargs)]
    if kwnames:
        signature += ["*", *kwnames]
    lines = [f"def key({', '.join(signature)}):"]
    lines += [f"    {let}" for let in lets]
    if guards:
        lines.append(f"    if {' or '.join(guards)}:")
        lines.append("        raise TypeError")
    key = ", ".join(["_base", "_device", *parts, *kwnames])
    lines.append(f"    return ({key}), ({', '.join(out)},)")
    namespace: dict[str, Any] = {}
    # Generated from parameter positions and identifier keyword names only.
    exec("\n".join(lines) + "\n", namespace)  # noqa: S102
    key = namespace["key"]
    key.pointers = tuple(pointers)  # where the launch arguments hold tensor addresses
    return key


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "data_ptr") and hasattr(value, "dtype")


class _Entry:
    """One compiled kernel: how to launch it, and the constant tail of its arguments.

    ``launch`` is the compiled kernel's launcher; where it is Triton 3.6's ``CudaLauncher``
    and the kernel needs no scratch memory, its C function, called with what
    ``CudaLauncher.__call__`` would add (Note [triton launch]). ``head`` holds what comes
    after the stream: the function and the metadata (with, for the C function, the
    cooperative-grid and PDL flags and two empty scratch buffers), then no launch metadata
    and no hooks.
    """

    __slots__ = ("launch", "head", "tail", "spec")

    def __init__(self, kernel: Any, tail: tuple, spec: Any) -> None:
        run = kernel.run
        direct = _direct_launcher(run)
        if direct is not None:
            self.launch = direct
            self.head: tuple[Any, ...] = (
                kernel.function,
                run.launch_cooperative_grid,
                run.launch_pdl,
                None,
                None,
                kernel.packed_metadata,
                None,
                None,
                None,
            )
        else:
            self.launch = run
            self.head = (kernel.function, kernel.packed_metadata, None, None, None)
        self.tail = tail
        self.spec = spec


# The parameters of Triton 3.6's CudaLauncher.__call__, whose body the direct launch does.
_LAUNCHER_CALL = ["self", "gridX", "gridY", "gridZ", "stream", "function", "args"]


def _direct_launcher(run: Any) -> Any:
    """The C launch function behind ``run``, where calling it directly is what ``run`` does."""
    launch = getattr(run, "launch", None)
    call = getattr(type(run), "__call__", None)  # noqa: B004 (the class's function, compared below)
    if launch is None or call is None or type(run).__name__ != "CudaLauncher":
        return None
    try:
        names = list(inspect.signature(call).parameters)
    except (TypeError, ValueError):
        return None
    if names != _LAUNCHER_CALL:
        return None
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None  # scratch memory is allocated per launch: leave it to the launcher
    return launch


class FastRun:
    """The ``run`` of an accelerated JITFunction (Note [triton launch]).

    ``launch(grid, *args, **kwargs)`` is what ``kernel[grid](*args, **kwargs)`` calls;
    ``run(*args, grid=, warmup=, **kwargs)``, Triton's own signature, is what an autotuner
    calls.
    """

    def __init__(self, fn: Any) -> None:
        from triton import knobs
        from triton.runtime.driver import driver

        self.fn = fn
        self.triton_run = type(fn).run.__get__(fn)
        self.plans: dict[tuple, list[_Plan]] = {}
        self.runtime = knobs.runtime
        # Launch hooks are chains, empty unless a profiler (proton) adds to them.
        self.chain = getattr(knobs, "HookChain", None)
        self.compilation = knobs.compilation
        self.driver = driver
        self.check = os.environ.get("FIBGEN_CHECK_LAUNCH", "").strip() not in ("", "0")
        self.count = 0  # entries kept, over every plan
        self.launches = 0  # launches that took the fast path, for tests and benchmarks

    def __call__(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        if warmup:
            return self.triton_run(*args, grid=grid, warmup=warmup, **kwargs)
        return self.launch(grid, *args, **kwargs)

    def launch(self, grid: Any, *args: Any, **kwargs: Any) -> Any:
        runtime = self.runtime
        enter, leave, chain = runtime.launch_enter_hook, runtime.launch_exit_hook, self.chain
        if (
            (enter is not None and (type(enter) is not chain or enter.calls))
            or (leave is not None and (type(leave) is not chain or leave.calls))
            or self.fn.pre_run_hooks
        ):
            return self._through_triton(args, kwargs, grid, HOOKS_SET)
        shape = (len(args), *kwargs)
        plans = self.plans.get(shape)
        if plans is None:
            plans = self._add_plan(shape, args)
        device = self.device()
        base = (runtime.debug, self.compilation.instrumentation_mode)
        for plan in plans:
            try:
                key, launch_args = plan.key(device, base, *args, **kwargs)
                entry = plan.entries.get(key)
            except Exception:  # another kind of argument, or an unhashable constexpr
                continue
            break
        else:
            # No plan fits these arguments' kinds: make one, or let Triton key the call.
            if not plans or len(plans) >= _MAX_PLANS:
                return self._through_triton(args, kwargs, grid, "its arguments are not keyed")
            plan = self._add_plan(shape, args)[-1]
            try:
                key, launch_args = plan.key(device, base, *args, **kwargs)
                entry = plan.entries.get(key)
            except Exception:
                return self._through_triton(args, kwargs, grid, "its arguments are not keyed")
        if entry is None:
            return self._first(key, plan, args, kwargs, grid)
        if self.fn.used_global_vals:
            self._check_globals()
        if callable(grid):
            grid = grid(dict(zip(plan.names, args + entry.tail)))
        n = len(grid)
        if self.check:
            self._check(entry, args, kwargs, device)
        g0, g1, g2 = grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1
        stream = self.stream(device)
        entry.launch(g0, g1, g2, stream, *entry.head, *launch_args, *entry.tail)
        self.launches += 1
        if recording:
            if self.fn.used_global_vals or self.check:
                note(f"kernel {self.fn.__name__!r} reads globals or is checked per launch")
            else:
                launch = (entry.launch, (g0, g1, g2), stream, entry.head, launch_args, entry.tail)
                note(launch + (plan.key.pointers,))
        return None

    def _through_triton(self, args: tuple, kwargs: dict, grid: Any, why: str) -> Any:
        """Launch through Triton's own run (which compiles where it must)."""
        if recording:
            note(
                why
                if why in PASSING
                else f"kernel {self.fn.__name__!r} launched through Triton: {why}"
            )
        return self.triton_run(*args, grid=grid, warmup=False, **kwargs)

    def device(self) -> int:
        """The current device, as JITFunction.run asks the driver (bound at the first call:
        there is no active driver before a GPU is used)."""
        import torch

        active = self.driver.active
        # The driver's calls take the place of these two methods on this instance.
        current = getattr(torch._C, "_cuda_getDevice", None) or active.get_current_device
        self.device = current  # type: ignore[method-assign]
        self.stream = active.get_current_stream  # type: ignore[method-assign]
        return self.device()

    def stream(self, device: int) -> int:
        """The current stream of ``device`` (bound by ``device``)."""
        self.device()
        return self.stream(device)

    def _add_plan(self, shape: tuple, args: tuple) -> list[_Plan]:
        """The plans of a call shape, with one more made from ``args`` where that keys them.

        A shape whose first call cannot be keyed keeps an empty list: Triton keys its calls.
        """
        plan = _Plan(self.fn, shape[0], shape[1:], args)
        with _lock:
            plans = self.plans.get(shape)
            if plans is None:
                plans = self.plans[shape] = [plan] if plan.key is not None else []
            elif plan.key is not None:
                plans.append(plan)
            return plans

    def _first(self, key: tuple, plan: _Plan, args: tuple, kwargs: dict, grid: Any) -> Any:
        """A key not seen yet: Triton compiles (or finds) and launches; the kernel is kept."""
        if recording:
            note(FIRST_CALL)
        kernel = self.triton_run(*args, grid=grid, warmup=False, **kwargs)
        if (
            kernel is None
            or hasattr(kernel, "result")
            or self.count >= _MAX_ENTRIES
            or not _keyable(key)
        ):
            return kernel
        tail = []
        for p in self.fn.params[len(args) :]:
            value = kwargs.get(p.name, p.default)
            if value is inspect.Parameter.empty:
                return kernel  # Triton reported the missing argument already
            tail.append(value)
        entry = _Entry(kernel, tuple(tail), self._spec(args, kwargs, key[1]))
        with _lock:
            if key not in plan.entries:
                plan.entries[key] = entry
                self.count += 1
        return kernel

    def _spec(self, args: tuple, kwargs: dict, device: int) -> Any:
        """Triton's own specialization of a call (its binder), or None where it has none."""
        caches = getattr(self.fn, "device_caches", None)
        if caches is None or device not in caches:
            return None
        _, specialization, options = caches[device][4](*args, **kwargs)
        return tuple(specialization), str(options)

    def _check(self, entry: _Entry, args: tuple, kwargs: dict, device: int) -> None:
        spec = self._spec(args, kwargs, device)
        if entry.spec is not None and spec is not None and spec != entry.spec:
            raise RuntimeError(
                f"fibgen's launch cache of Triton kernel {self.fn.__name__!r} keyed two calls "
                f"alike that Triton specializes differently: {entry.spec} and {spec}; set "
                "FIBGEN_TRITON_LAUNCH=triton to launch through Triton, and report it"
            )

    def _check_globals(self) -> None:
        # As JITFunction.run does: a global a kernel read at compile time must not change.
        missing = object()
        for (name, _), (value, scope) in self.fn.used_global_vals.items():
            now = scope.get(name, missing)
            if now != value:
                raise RuntimeError(
                    f"Global variable {name} has changed since we compiled this kernel, "
                    f"from {value} to {now}"
                )


def _keyable(value: Any) -> bool:
    """Whether a key compares by value: it holds no tensor (hashed by identity)."""
    if isinstance(value, tuple):
        return all(_keyable(v) for v in value)
    return not _is_tensor(value)
