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

import inspect
import keyword
import os
import threading
from types import ModuleType
from typing import Any

# Specializations kept per kernel, and key plans per call shape; beyond, Triton launches.
_MAX_ENTRIES = 4096
_MAX_PLANS = 4
_lock = threading.Lock()


def enabled() -> bool:
    """Whether the solution loader accelerates Triton kernels (``FIBGEN_TRITON_LAUNCH``)."""
    return os.environ.get("FIBGEN_TRITON_LAUNCH", "fibgen").strip().lower() != "triton"


def _jit_function_type() -> type | None:
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
    return kernel


def accelerated(kernel: Any) -> FastRun | None:
    """The fast run of an accelerated kernel, or None."""
    run = getattr(_innermost(kernel), "__dict__", {}).get("run")
    return run if isinstance(run, FastRun) else None


def restore(kernel: Any) -> None:
    """Undo ``accelerate``: launches go through Triton's own run again."""
    if accelerated(kernel) is not None:
        del _innermost(kernel).run


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

    __slots__ = ("key", "names", "tail_names")

    def __init__(self, fn: Any, nargs: int, kwnames: tuple[str, ...], args: tuple) -> None:
        params = fn.params
        self.names = [p.name for p in params]
        self.tail_names = self.names[nargs:]
        self.key = _key_function(params, nargs, kwnames, args)


def _key_function(params: list, nargs: int, kwnames: tuple[str, ...], args: tuple) -> Any:
    """The generated key function of a call shape, or None where Triton must key the call."""
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
    guards, parts = [], []
    for i, (p, a) in enumerate(zip(params, args)):
        name = f"_{i}"
        if p.is_constexpr:
            parts.append(name)
        elif _is_tensor(a):
            # Non-tensors fail here: ints, floats and None have neither attribute.
            parts.append(f"{name}.dtype")
            if not p.do_not_specialize_on_alignment:
                parts.append(f"not {name}.data_ptr() & 15")
        elif type(a) is int:
            guards.append(f"type({name}) is not int")
            parts.append(f"{name} == 1")
            parts.append(f"not {name} & 15")
            parts.append(f"-0x80000000 <= {name} <= 0x7FFFFFFF")
            parts.append(f"{name} >= 0x8000000000000000")
        elif a is None:
            guards.append(f"{name} is not None")
        elif type(a) in (float, bool):
            guards.append(f"type({name}) is not {type(a).__name__}")
        else:
            return None  # tuples, tensor descriptors, other objects: Triton keys them
    signature = [f"_{i}" for i in range(nargs)]
    if kwnames:
        signature += ["*", *kwnames]
    lines = [f"def key({', '.join(signature)}):"]
    if guards:
        lines.append(f"    if {' or '.join(guards)}:")
        lines.append("        raise TypeError")
    lines.append(f"    return ({', '.join(parts + list(kwnames))},)")
    namespace: dict[str, Any] = {}
    # Generated from parameter positions and identifier keyword names only.
    exec("\n".join(lines) + "\n", namespace)  # noqa: S102
    return namespace["key"]


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "data_ptr") and hasattr(value, "dtype")


class _Entry:
    """One compiled kernel, and the constant tail of its launch arguments."""

    __slots__ = ("run", "function", "metadata", "tail", "spec")

    def __init__(self, kernel: Any, tail: tuple, spec: Any) -> None:
        self.run = kernel.run
        self.function = kernel.function
        self.metadata = kernel.packed_metadata
        self.tail = tail
        self.spec = spec


class FastRun:
    """The ``run`` of an accelerated JITFunction (Note [triton launch])."""

    def __init__(self, fn: Any) -> None:
        from triton import knobs
        from triton.runtime.driver import driver

        self.fn = fn
        self.triton_run = type(fn).run.__get__(fn)
        self.plans: dict[tuple, list[_Plan]] = {}
        self.entries: dict[tuple, _Entry] = {}
        self.runtime = knobs.runtime
        # Launch hooks are chains, empty unless a profiler (proton) adds to them.
        self.chain = getattr(knobs, "HookChain", None)
        self.compilation = knobs.compilation
        self.driver = driver
        self.check = os.environ.get("FIBGEN_CHECK_LAUNCH", "").strip() not in ("", "0")
        self.launches = 0  # launches that took the fast path, for tests and benchmarks

    def __call__(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        runtime = self.runtime
        enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
        if (
            warmup
            or (enter is not None and (type(enter) is not self.chain or enter.calls))
            or (leave is not None and (type(leave) is not self.chain or leave.calls))
            or self.fn.pre_run_hooks
        ):
            return self.triton_run(*args, grid=grid, warmup=warmup, **kwargs)
        shape = (len(args), tuple(kwargs))
        plans = self.plans.get(shape)
        if plans is None:
            plans = self._add_plan(shape, args)
        active = self.driver.active
        device = active.get_current_device()
        base = (shape, device, runtime.debug, self.compilation.instrumentation_mode)
        entry = None
        for plan in plans:
            try:
                key = (base, plan, plan.key(*args, **kwargs))
                entry = self.entries.get(key)
            except Exception:  # another kind of argument, or an unhashable constexpr
                continue
            break
        else:
            # No plan fits these arguments' kinds: make one, or let Triton key the call.
            plan = None
            if plans and len(plans) < _MAX_PLANS:
                plan = self._add_plan(shape, args)[-1]
            try:
                key = (base, plan, plan.key(*args, **kwargs))
                entry = self.entries.get(key)
            except Exception:
                return self.triton_run(*args, grid=grid, warmup=warmup, **kwargs)
        if entry is None:
            return self._first(key, plan, args, kwargs, grid)
        if self.fn.used_global_vals:
            self._check_globals()
        if callable(grid):
            grid = grid(dict(zip(plan.names, args + entry.tail)))
        n = len(grid)
        if self.check:
            self._check(entry, args, kwargs, device)
        entry.run(
            grid[0],
            grid[1] if n > 1 else 1,
            grid[2] if n > 2 else 1,
            active.get_current_stream(device),
            entry.function,
            entry.metadata,
            None,
            None,
            None,
            *args,
            *entry.tail,
        )
        self.launches += 1
        return None

    def _add_plan(self, shape: tuple, args: tuple) -> list[_Plan]:
        """The plans of a call shape, with one more made from ``args`` where that keys them.

        A shape whose first call cannot be keyed keeps an empty list: Triton keys its calls.
        """
        plan = _Plan(self.fn, shape[0], shape[1], args)
        with _lock:
            plans = self.plans.get(shape)
            if plans is None:
                plans = self.plans[shape] = [plan] if plan.key is not None else []
            elif plan.key is not None:
                plans.append(plan)
            return plans

    def _first(self, key: tuple, plan: _Plan, args: tuple, kwargs: dict, grid: Any) -> Any:
        """A key not seen yet: Triton compiles (or finds) and launches; the kernel is kept."""
        kernel = self.triton_run(*args, grid=grid, warmup=False, **kwargs)
        if (
            kernel is None
            or hasattr(kernel, "result")
            or len(self.entries) >= _MAX_ENTRIES
            or not _keyable(key)
        ):
            return kernel
        tail = []
        for p in self.fn.params[len(args) :]:
            value = kwargs.get(p.name, p.default)
            if value is inspect.Parameter.empty:
                return kernel  # Triton reported the missing argument already
            tail.append(value)
        entry = _Entry(kernel, tuple(tail), self._spec(args, kwargs, key[0][1]))
        with _lock:
            self.entries.setdefault(key, entry)
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
