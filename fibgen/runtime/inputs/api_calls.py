"""The API call that stands for a definition's inputs, made through its dispatcher.

Note [api calls]
~~~~~~~~~~~~~~~~
A dispatcher maps the arguments of an API call to the definition's inputs. Bench measures
the other way round: it holds a workload's inputs and must time what apply delivers, the
call an engine makes, routed through the generated dispatcher (its key, its rules, its
output buffers, launch replay) and compared with the API's own function. Each dispatcher
registers a recipe (``call`` and, for a plan/run wrapper, ``plan_call``; computed from the
family's `<-`/`->` mappings and rules by ``fibgen/codegen/python/dispatch/call.py``): per
parameter, the input, the output buffer, the value a rule requires, the definition's
parameter or const axis, or nothing (its default). ``build`` turns a recipe and a workload
into an ``ApiCall``; a wrapper is constructed (a workspace buffer for its first parameter)
and planned, and its plan captured as the patched ``plan`` would.

A recipe is a guess at the inverse of a mapping, so it is checked before it is trusted:
``ApiCall.check`` routes the call in strict mode to a probe that records what it receives,
and the probe must receive exactly the workload's inputs (the same tensors' data, the same
values). A call the dispatcher refuses, or that reaches the probe with other inputs, is not
used, and the reason says why (bench then times the solution directly, and says so).

Two variants of the call: ``engine`` passes the buffers of required outputs only and lets
the dispatcher allocate the rest, as an engine calling ``flashinfer.norm.rmsnorm(x, w, eps)``
does; ``with_buffers`` passes a buffer for every output (and sets a ``return_<buffer>``
flag), so that what the call wrote can be compared with the reference.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fibgen.runtime.routing.api import Api
from fibgen.runtime.routing.state import STATE

# The workspace a FlashInfer wrapper is constructed with (its own examples use 128 MiB).
WORKSPACE_BYTES = 128 << 20


class CallUnavailable(Exception):
    """The definition's inputs cannot be turned into a call of its API; says why."""


def api_for(
    name: str, definition: Mapping[str, Any] | None = None, packages: Any = None
) -> Api | None:
    """The dispatcher that routes definition ``name``, importing the generated packages.

    Where several packages know the name (two catalogues in one process), the newest whose
    inputs and dtypes are ``definition``'s (its JSON), when given.
    """
    from fibgen.runtime.routing.registry import import_packages

    import_packages(STATE, packages, (name,), False)
    with STATE.lock:
        found = [api for api in STATE.apis if name in api.known_names]
    if definition is not None:
        found = [api for api in found if _fits(api, definition)]
    return found[-1] if found else None


def _fits(api: Api, definition: Mapping[str, Any]) -> bool:
    inputs = definition.get("inputs", {})
    if tuple(inputs) != api.inputs or tuple(definition.get("outputs", {})) != api.outputs:
        return False
    for tensor, spec in inputs.items():
        dtype = api.tensors.get(tensor, (None, ()))[0]
        if dtype is not None and isinstance(spec, Mapping) and spec.get("dtype") != dtype:
            return False
    return True


def _resolve(path: str) -> Any:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError as exc:
            raise CallUnavailable(f"{path} does not exist: {exc}") from None
        return obj
    raise CallUnavailable(f"{path}: no module of it can be imported")


def _wrapper(plan_path: str, device: torch.device) -> Any:
    """A new instance of the wrapper class whose ``plan`` is ``plan_path``."""
    cls = _resolve(plan_path.rpartition(".")[0])
    try:
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError) as exc:
        raise CallUnavailable(f"cannot read the constructor of {cls.__qualname__}: {exc}") from exc
    args = []
    for i, p in enumerate(params):
        if p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            break
        if i == 0 and "workspace" in p.name:
            args.append(torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device))
        else:
            raise CallUnavailable(
                f"{cls.__qualname__}() needs {p.name}, which fibgen cannot make up"
            )
    try:
        return cls(*args)
    except Exception as exc:
        raise CallUnavailable(f"{cls.__qualname__}() failed: {type(exc).__name__}: {exc}") from exc


@dataclass
class ApiCall:
    """One call of a definition's API, ready to make (Note [api calls])."""

    api: Api
    name: str
    engine: tuple[tuple[Any, ...], dict[str, Any]]
    with_buffers: tuple[tuple[Any, ...], dict[str, Any]]
    outputs: dict[str, Any] = field(default_factory=dict)
    instance: Any = None
    plan: tuple[tuple[Any, ...], dict[str, Any]] | None = None

    def capture(self) -> None:
        """Let the dispatcher see the wrapper's plan, as the patched ``plan()`` would; call it
        after every ``enable_apply``, which forgets the plans seen before."""
        if self.instance is not None and self.plan is not None and self.api.capture is not None:
            args, kwargs = self.plan
            self.api.capture(self.instance, *args, **kwargs)

    def routed(self, buffers: bool = False) -> Any:
        """The call through the dispatcher, as apply routes it."""
        args, kwargs = self.with_buffers if buffers else self.engine
        if self.instance is not None:
            return self.api.function(self.instance, *args, **kwargs)
        return self.api.function(*args, **kwargs)

    def original(self, buffers: bool = False) -> Any:
        """The call of the API's own function (apply off); CallUnavailable without one."""
        fn = self.api.original()
        if fn is None:
            raise CallUnavailable(f"{self.api.label} has no original function here")
        args, kwargs = self.with_buffers if buffers else self.engine
        if self.instance is not None:
            return fn(self.instance, *args, **kwargs)
        return fn(*args, **kwargs)

    def check(self, inputs: Mapping[str, Any]) -> None:
        """Route the call in strict mode to a probe; CallUnavailable unless the probe gets
        exactly ``inputs`` (Note [api calls])."""
        from fibgen.runtime.routing.apply import disable_apply, enable_apply, is_enabled

        if is_enabled():
            raise CallUnavailable("apply is on: the call is checked with apply off")
        seen: dict[str, Any] = {}

        def probe(**received: Any) -> None:
            seen.update(received)
            raise _Probed()

        try:
            with enable_apply({self.name: probe}, strict=True, patch=False, packages=()):
                self.capture()
                try:
                    self.routed(buffers=True)
                except Exception as exc:
                    # Strict mode reports the probe's exception as the solution's error.
                    if not (isinstance(exc, _Probed) or isinstance(exc.__cause__, _Probed)):
                        raise
        except CallUnavailable:
            raise
        except Exception as exc:
            raise CallUnavailable(
                f"the dispatcher does not route the call fibgen made of the inputs: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        finally:
            if is_enabled():
                disable_apply()
        if not seen:
            raise CallUnavailable("the call made of the inputs never reached a solution")
        for input_name, value in inputs.items():
            got = seen.get(input_name, _MISSING)
            if not _same(got, value):
                raise CallUnavailable(
                    f"the call made of the inputs passes another value as input {input_name}"
                )


class _Probed(Exception):
    """Raised by the probe once it has seen its inputs: nothing after it runs."""


_MISSING = object()


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, torch.Tensor):
        return (
            isinstance(got, torch.Tensor)
            and got.dtype == want.dtype
            and got.shape == want.shape
            and got.stride() == want.stride()
            and got.device == want.device
            and (want.numel() == 0 or got.data_ptr() == want.data_ptr())
        )
    if want is None:
        return got is None
    try:
        return bool(got == want)
    except Exception:
        return False


def _value(
    api: Api, name: str, definition: Mapping[str, Any], how: str, arg: Any, values: dict
) -> Any:
    if how == "input":
        return values[arg]
    if how == "inputs":
        indices = [i for i, _ in arg]
        if indices != list(range(len(indices))):
            raise CallUnavailable(f"a tuple of inputs at positions {indices}")
        return tuple(values[n] for _, n in arg)
    if how == "literal":
        return arg
    if how == "param":
        params = api.call_params.get(name)
        if params is None or arg not in params:
            raise CallUnavailable(f"no value of parameter {arg} for {name}")
        return params[arg]
    if how == "torch":
        return getattr(torch, arg)
    if how == "axis":
        axis = definition.get("axes", {}).get(arg, {})
        if axis.get("type") != "const" or "value" not in axis:
            raise CallUnavailable(f"axis {arg} of {name} has no const value")
        return axis["value"]
    raise CallUnavailable(f"unknown recipe entry {how!r}")


def _side(
    api: Api,
    name: str,
    definition: Mapping[str, Any],
    recipe: tuple[tuple[str, str, Any], ...],
    inputs: Mapping[str, Any],
    outputs: Mapping[str, Any],
    buffers: bool,
    required: frozenset[str],
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    kwargs: dict[str, Any] = {}
    for param, how, arg in recipe:
        if how == "empty":
            continue
        if how == "output":
            if buffers or param in required:
                kwargs[param] = outputs[arg]
            continue
        if how == "literal" and arg is True and param.startswith("return_") and not buffers:
            continue  # a flag that asks for an output the engine call does not pass
        kwargs[param] = _value(api, name, definition, how, arg, dict(inputs))
    return (), kwargs


def _required_params(fn: Callable[..., Any] | None) -> frozenset[str]:
    if fn is None:
        return frozenset()
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    return frozenset(p.name for p in params if p.default is p.empty)


def build(
    api: Api,
    name: str,
    definition: Mapping[str, Any],
    inputs: Mapping[str, Any],
    outputs: Mapping[str, Any],
    device: torch.device | str,
) -> ApiCall:
    """The call of ``api`` that stands for ``inputs`` of definition ``name`` (unchecked:
    ``ApiCall.check`` checks it); CallUnavailable says why there is none."""
    if api.call is None:
        raise CallUnavailable(api.call_problem or f"{api.label} has no call recipe")
    try:
        required = _required_params(api.function)
        engine = _side(api, name, definition, api.call, inputs, outputs, False, required)
        full = _side(api, name, definition, api.call, inputs, outputs, True, required)
        instance = None
        plan_args: tuple[Any, ...] = ()
        plan_kwargs: dict[str, Any] = {}
        if api.plan_call is not None:
            if api.plan_path is None or api.capture is None:
                raise CallUnavailable(f"{api.label} has a plan recipe but no plan")
            instance = _wrapper(api.plan_path, torch.device(device))
            plan_args, plan_kwargs = _side(
                api, name, definition, api.plan_call, inputs, outputs, True, frozenset()
            )
            plan = _resolve(api.plan_path)
            original_plan = STATE.originals.get(api.plan_path, plan)
            try:
                original_plan(instance, *plan_args, **plan_kwargs)
            except Exception as exc:
                raise CallUnavailable(
                    f"{api.plan_path}() failed on the workload: {type(exc).__name__}: {exc}"
                ) from exc
    except KeyError as exc:
        raise CallUnavailable(f"the workload has no input or output {exc}") from None
    plan_call = (plan_args, plan_kwargs) if instance is not None else None
    return ApiCall(api, name, engine, full, dict(outputs), instance, plan_call)
