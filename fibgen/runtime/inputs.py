"""Valid random inputs for a definition, from a few var-axis values.

``generate_inputs(spec, axes)`` makes every input of a definition: tensors of the declared
dtype and shape, filled as their generation hints say (``fibgen.format.hints`` lists the
kinds), then checks the definition's constraints by evaluating them.

Var axes the caller leaves out are derived, in this order of preference:
1. from constraints over axes only, ``len_indptr == batch_size + 1`` (solved for whichever
   side is unknown when the relation is linear), and inequalities such as
   ``topk <= max_num_pages * page_size`` (the smallest value from the default up that holds);
2. from hints: ``indptr(over=kv_indices)`` decides the length of ``kv_indices``,
   ``last_page_len`` the batch it covers, ``indices(below=num_pages)`` the axis it indexes;
3. otherwise ``DEFAULT_VAR_AXIS``.

Note [fp4]: ``float4_e2m1`` tensors are ``torch.float4_e2m1fn_x2`` when torch has it (each
element is one byte holding two FP4 values, so the declared last axis counts bytes), else
``uint8`` with the same packing. Random bytes are always valid: e2m1 has no NaN or Inf.

Note [fp8 from bits]: random float8 fills are built from random bytes, not by rounding
``randn``: drawing a normal per element made the multi-GiB MoE weights take 13-17 s, bytes
take an eighth of that. Each byte keeps a random sign and the low exponent and mantissa bits;
the high exponent bits are fixed so that every value is a normal number of magnitude in
[1/8, 2): never NaN, Inf, zero or subnormal, with a spread close to a unit normal's.

Note [generator on CPU]: values are drawn on the CPU from one ``torch.Generator`` and then
moved to ``device``, so the same seed gives the same inputs on every device.
"""

from __future__ import annotations

import ast
import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from fibgen.format.hints import DEFAULT_VAR_AXIS, HINT_SIGNATURES, HintError, bind_hint
from fibgen.format.models import DTYPE_BYTES

__all__ = [
    "DEFAULT_VAR_AXIS",
    "Hint",
    "InputGenerationError",
    "InputSpec",
    "available_memory",
    "estimate_nbytes",
    "format_bytes",
    "generate_inputs",
    "generate_inputs_with_axes",
    "parse_hint",
    "torch_dtype",
]

# Small enough for a CPU reference on any definition, large enough to exercise batching.
# Segment lengths of an indptr when the total is free: "a few tokens per sequence".
DEFAULT_MIN_LEN = 1
DEFAULT_MAX_LEN = 8

# (kind, positional argument texts, ((keyword, text), ...)): cheap to embed in generated code.
Hint = tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]]

_FLOAT_DTYPES = {"float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1"}
_INT_DTYPES = {"int64", "int32", "int16", "int8"}

_TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "float4_e2m1": getattr(torch, "float4_e2m1fn_x2", torch.uint8),  # Note [fp4]
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "bool": torch.bool,
}

# Note [fp8 from bits]: (bits kept from a random byte, bits set) per float8 format. e4m3fn:
# s.eeee.mmm with the exponent forced to 0b01xx (2^-3..2^0); e5m2: s.eeeee.mm with the
# exponent forced to 0b011xx (2^-3..2^0).
_FP8_BITS = {"float8_e4m3fn": (0x9F, 0x20), "float8_e5m2": (0x8F, 0x30)}

# What hint and constraint expressions may call besides axes, parameters and inputs.
_FUNCS: dict[str, Any] = {
    name: getattr(math, name)
    for name in ("sqrt", "log", "log2", "log10", "exp", "ceil", "floor", "pi", "e", "inf")
}
_FUNCS.update(min=min, max=max, abs=abs, int=int, float=float, round=round, len=len, bool=bool)


class InputGenerationError(ValueError):
    """Inputs that cannot be made, or that violate a constraint of the definition."""


# Note [input sizes]
# Var-axis values come from users and datasets: `--axes batch_size=100000000` asks for a
# 763 GiB tensor, and the allocator's answer is a traceback (or the OOM killer). So before
# each tensor is made its bytes are counted, and a tensor that would take the inputs past the
# memory the host has free is refused with the input's name, shape and size; the same holds
# for the device the inputs are moved to. The count leaves out the temporaries of a fill (a
# float32 draw converted to bfloat16): it refuses what cannot fit, never what might.


def available_memory() -> int | None:
    """Bytes the host can still give this process (MemAvailable, capped by RLIMIT_AS); None
    when the system does not say."""
    free = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        pass
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            free = None
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit != resource.RLIM_INFINITY:
            free = limit if free is None else min(free, limit)
    except (ImportError, OSError, ValueError):
        pass
    return free


def format_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit that keeps it at least 1: ``763.0 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a FlashInfer Trace dtype name."""
    try:
        return _TORCH_DTYPES[dtype]
    except KeyError:
        raise InputGenerationError(
            f"unknown dtype `{dtype}`; known: {', '.join(_TORCH_DTYPES)}"
        ) from None


def parse_hint(text: str) -> Hint:
    """Parse ``"indptr(over=kv_indices)"`` (the `.fidef` spelling, without `gen`) to a Hint."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise InputGenerationError(f"generation hint `{text}` is not valid: {e.msg}") from None
    if isinstance(node, ast.Name):
        return (node.id, (), ())
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise InputGenerationError(f"generation hint `{text}` must look like `kind(args)`")
    args = tuple(ast.unparse(a) for a in node.args)
    kwargs = tuple((k.arg, ast.unparse(k.value)) for k in node.keywords if k.arg is not None)
    return (node.func.id, args, kwargs)


def _norm_hint(hint: Any) -> Hint | None:
    if hint is None:
        return None
    if isinstance(hint, str):
        return parse_hint(hint)
    kind, args, kwargs = hint
    return (str(kind), tuple(args), tuple((k, v) for k, v in kwargs))


@dataclass(frozen=True)
class InputSpec:
    """What input generation needs to know about one definition."""

    name: str
    # (axis name, "var" | "const", value or None for var axes), in declaration order
    axes: tuple[tuple[str, str, int | None], ...]
    # (input name, dtype, shape or None for a Python scalar, optional, hint or None)
    inputs: tuple[tuple[str, str, tuple[str, ...] | None, bool, Hint | None], ...]
    constraints: tuple[str, ...] = ()
    params: dict = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        axis_names = {a[0] for a in self.axes}
        norm = []
        for name, dtype, shape, optional, hint in self.inputs:
            torch_dtype(dtype)
            if shape is not None:
                shape = tuple(shape)
                for dim in shape:
                    if dim not in axis_names:
                        raise InputGenerationError(
                            f"{self.name}: input `{name}` uses undeclared axis `{dim}`"
                        )
            hint = _norm_hint(hint)
            if hint is not None:
                try:
                    bind_hint(hint[0], hint[1], hint[2])
                except HintError as e:
                    raise InputGenerationError(f"{self.name}: input `{name}`: {e}") from None
            norm.append((name, dtype, shape, bool(optional), hint))
        object.__setattr__(self, "inputs", tuple(norm))
        object.__setattr__(self, "axes", tuple((n, k, v) for n, k, v in self.axes))
        object.__setattr__(self, "constraints", tuple(self.constraints))

    @classmethod
    def from_definition_json(cls, d: dict, hints: dict | None = None) -> "InputSpec":
        """Build from a FlashInfer Trace definition dict; ``hints`` maps input name to hint.

        Without a hint, a sampling definition's ``probs`` are probability rows: that is how
        flashinfer-bench makes them (a softmax of random values), and random normals are not.
        """
        hints = dict(hints or {})
        if d.get("op_type") == "sampling" and "probs" in d["inputs"]:
            hints.setdefault("probs", "prob()")
        axes = tuple(
            (name, a["type"], a.get("value") if a["type"] == "const" else None)
            for name, a in d["axes"].items()
        )
        inputs = tuple(
            (
                name,
                t["dtype"],
                None if t.get("shape") is None else tuple(t["shape"]),
                bool(t.get("optional", False)),
                hints.get(name),
            )
            for name, t in d["inputs"].items()
        )
        return cls(d["name"], axes, inputs, tuple(d.get("constraints", ())), {})

    @classmethod
    def from_ir(cls, definition: Any, family: Any = None) -> "InputSpec":
        """Build from a compiled ``ir.Definition`` (hints come from its ``ir.Family``)."""
        hints: dict[str, Hint] = {}
        if family is not None:
            for t in family.inputs:
                if t.gen is not None:
                    hints[t.name] = (
                        t.gen.kind,
                        tuple(a.text for a in t.gen.args),
                        tuple((k, v.text) for k, v in t.gen.kwargs),
                    )
        axes = tuple((a.name, a.kind, a.value) for a in definition.axes)
        inputs = tuple(
            (t.name, t.dtype, t.shape, t.optional, hints.get(t.name)) for t in definition.inputs
        )
        return cls(
            definition.name,
            axes,
            inputs,
            tuple(definition.constraints),
            dict(definition.param_values),
        )


def generate_inputs(
    spec: InputSpec, axes: dict[str, int] | None = None, *, device: Any = "cpu", seed: int = 0
) -> dict[str, Any]:
    """Make valid inputs for ``spec`` at the given var-axis values (others are derived)."""
    return generate_inputs_with_axes(spec, axes, device=device, seed=seed)[0]


def generate_inputs_with_axes(
    spec: InputSpec, axes: dict[str, int] | None = None, *, device: Any = "cpu", seed: int = 0
) -> tuple[dict[str, Any], dict[str, int]]:
    """Like ``generate_inputs``, also returning every axis value (given, const and derived)."""
    gen = _Generator(spec, dict(axes or {}), seed)
    values = gen.run()
    dev = torch.device(device)
    if dev.type != "cpu":
        _check_device_memory(spec, values, dev)
        values = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in values.items()}
    return values, dict(gen.axes)


def _check_device_memory(spec: InputSpec, values: dict[str, Any], device: torch.device) -> None:
    """Refuse inputs that the device has no room for (Note [input sizes])."""
    if device.type != "cuda":
        return
    need = sum(v.numel() * v.element_size() for v in values.values() if isinstance(v, torch.Tensor))
    free, _ = torch.cuda.mem_get_info(device)
    if need > free:
        raise InputGenerationError(
            f"{spec.name}: the inputs take {format_bytes(need)}, more than the "
            f"{format_bytes(free)} free on {device}; give smaller var-axis values"
        )


def estimate_nbytes(spec: InputSpec, axes: dict[str, int] | None = None) -> int:
    """Rough size of the inputs in bytes; var axes not given count as ``DEFAULT_VAR_AXIS``."""
    known = {n: v for n, k, v in spec.axes if k == "const"}
    known.update(axes or {})
    total = 0
    for _, dtype, shape, _, _ in spec.inputs:
        if shape is None:
            continue
        numel = math.prod(known.get(dim, DEFAULT_VAR_AXIS) for dim in shape)
        total += numel * DTYPE_BYTES[dtype]
    return total


# ---------------------------------------------------------------------------------------
# The generator
# ---------------------------------------------------------------------------------------


def _names(text: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name)}


def _bare_name(text: str) -> str | None:
    node = ast.parse(text, mode="eval").body
    return node.id if isinstance(node, ast.Name) else None


def _show(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        if value.numel() <= 8:
            return f"tensor({value.tolist()})"
        return f"tensor of shape {list(value.shape)}"
    return repr(value)


class _Generator:
    def __init__(self, spec: InputSpec, given: dict[str, int], seed: int) -> None:
        self.spec = spec
        self.rng = torch.Generator(device="cpu").manual_seed(seed)
        self.kinds = {n: k for n, k, _ in spec.axes}
        self.axes: dict[str, int] = {n: int(v) for n, k, v in spec.axes if k == "const"}
        for name, value in given.items():
            if name not in self.kinds:
                raise InputGenerationError(
                    f"{spec.name} has no axis `{name}`; its axes are {', '.join(self.kinds)}"
                )
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InputGenerationError(
                    f"{spec.name}: axis `{name}` must be a non-negative int, got {value!r}"
                )
            if self.kinds[name] == "const" and self.axes[name] != value:
                raise InputGenerationError(
                    f"{spec.name}: `{name}` is a const axis of value {self.axes[name]}, "
                    f"cannot set it to {value}"
                )
            self.axes[name] = value
        self.inputs = {i[0]: i for i in spec.inputs}
        self.values: dict[str, Any] = {}
        self.bound: dict[str, dict] = {}
        for name, _, _, _, hint in spec.inputs:
            if hint is not None:
                self.bound[name] = bind_hint(hint[0], hint[1], hint[2])
        self.axis_constraints = [c for c in spec.constraints if not self._mentions_inputs(c)]
        # Bytes of the tensors made so far, and what the host can give (Note [input sizes]).
        self.nbytes = 0
        self.memory = available_memory()

    # -- environment ------------------------------------------------------------------

    def _mentions_inputs(self, text: str) -> bool:
        return bool(_names(text) & set(self.inputs))

    def _env(self) -> dict[str, Any]:
        env: dict[str, Any] = dict(_FUNCS)
        env.update(self.spec.params)
        env.update(self.axes)
        env.update(self.values)
        return env

    def _known(self, name: str) -> bool:
        return (
            name in self.axes
            or name in self.values
            or name in self.spec.params
            or (name in _FUNCS and name not in self.kinds and name not in self.inputs)
        )

    def _check_names(self, text: str, where: str) -> None:
        for name in _names(text):
            if not (
                name in self.kinds
                or name in self.inputs
                or name in self.spec.params
                or name in _FUNCS
            ):
                raise InputGenerationError(
                    f"{self.spec.name}: {where} `{text}` uses `{name}`, which is not an axis, "
                    f"parameter or input"
                )

    def _eval(self, text: str, where: str) -> Any:
        try:
            return eval(compile(text, "<expr>", "eval"), {"__builtins__": {}}, self._env())
        except Exception as e:  # a user expression: report it in their terms
            raise InputGenerationError(
                f"{self.spec.name}: cannot evaluate {where} `{text}`: {type(e).__name__}: {e}"
            ) from None

    # -- axis derivation ----------------------------------------------------------------

    def _unknown_axes(self, text: str) -> set[str]:
        return {n for n in _names(text) if n in self.kinds and n not in self.axes}

    def _propagate(self) -> None:
        """Solve axis-only equalities with one unknown until nothing changes."""
        changed = True
        while changed:
            changed = False
            for text in self.axis_constraints:
                node = ast.parse(text, mode="eval").body
                if not (
                    isinstance(node, ast.Compare)
                    and len(node.ops) == 1
                    and isinstance(node.ops[0], ast.Eq)
                ):
                    continue
                unknown = self._unknown_axes(text)
                if len(unknown) != 1:
                    continue
                (axis,) = unknown
                left, right = ast.unparse(node.left), ast.unparse(node.comparators[0])
                if axis in self._unknown_axes(right):
                    left, right = right, left
                if self._unknown_axes(right):
                    continue  # the axis appears on both sides: not a form we solve
                target = self._eval(right, "constraint")
                value = self._solve_linear(left, axis, target)
                if value is not None:
                    self.axes[axis] = value
                    changed = True

    def _solve_linear(self, expr: str, axis: str, target: Any) -> int | None:
        def f(x: int) -> Any:
            env = self._env()
            env[axis] = x
            return eval(compile(expr, "<expr>", "eval"), {"__builtins__": {}}, env)

        try:
            f0, f1, f2 = f(0), f(1), f(2)
        except Exception:
            return None
        slope = f1 - f0
        if slope == 0 or f2 - f1 != slope:
            return None
        x = (target - f0) / slope
        if x < 0 or x != int(x) or f(int(x)) != target:
            return None
        return int(x)

    def _default_axis(self, axis: str) -> int:
        """The default value, raised to the smallest that satisfies axis-only inequalities."""
        relevant = [
            c
            for c in self.axis_constraints
            if axis in _names(c) and self._unknown_axes(c) == {axis}
        ]

        def holds(x: int) -> bool:
            env = self._env()
            env[axis] = x
            try:
                return all(
                    eval(compile(c, "<c>", "eval"), {"__builtins__": {}}, env) for c in relevant
                )
            except Exception:
                return False

        x = DEFAULT_VAR_AXIS
        if not relevant or holds(x):
            return x
        hi = x
        while not holds(hi):
            hi *= 2
            if hi > 2**31:
                return x  # unsatisfiable from here: the constraint check will report it
        lo = hi // 2
        while lo + 1 < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if holds(mid) else (mid, hi)
        return hi

    # -- hint bookkeeping ---------------------------------------------------------------

    def _first_axis(self, tensor: str) -> str | None:
        if tensor in self.kinds:
            return tensor  # `over=total_q`: an axis directly
        inp = self.inputs.get(tensor)
        if inp is None or not inp[2]:
            raise InputGenerationError(
                f"{self.spec.name}: hint refers to `{tensor}`, which is not a tensor input "
                f"or an axis"
            )
        return inp[2][0]

    def _provides(self, name: str) -> set[str]:
        """Axes that generating input ``name`` decides when they are still unknown."""
        _, _, shape, _, hint = self.inputs[name]
        if hint is None:
            return set()
        b = self.bound[name]
        if hint[0] == "indptr":
            return {self._first_axis(_bare_name(b["over"]) or b["over"])}
        if hint[0] == "last_page_len" and shape:
            return {shape[0]}
        if hint[0] == "indices":
            bare = _bare_name(b["below"])
            if bare in self.kinds and self.kinds[bare] == "var":
                return {bare}
        return set()

    def _needs(self, name: str) -> set[str]:
        """Unknown axes and ungenerated inputs that input ``name`` waits for."""
        _, _, shape, _, hint = self.inputs[name]
        provided = self._provides(name)
        texts: list[str] = list(shape or ())
        if hint is not None:
            sig = HINT_SIGNATURES[hint[0]]
            for key, text in self.bound[name].items():
                if key in sig.tensor_params:
                    ref = _bare_name(text)
                    if ref is None:
                        raise InputGenerationError(
                            f"{self.spec.name}: `{key}` of hint `{hint[0]}` on `{name}` must "
                            f"name an input, got `{text}`"
                        )
                    if ref in self.inputs and key != "over":
                        texts.append(ref)
                else:
                    self._check_names(text, f"hint argument `{key}` of `{name}`")
                    texts.append(text)
        needs = set()
        for text in texts:
            for n in _names(text):
                if n in provided:
                    continue
                if n in self.inputs and n not in self.values:
                    needs.add(n)
                elif n in self.kinds and n not in self.axes:
                    needs.add(n)
        return needs

    def _pick_default(self, pending: list[str]) -> str | None:
        provided = set().union(*(self._provides(p) for p in pending)) if pending else set()
        # Axes pinned by a constraint on input values (`total_q == qo_indptr[-1].item()`)
        # follow from those values; defaulting them would contradict the generated data.
        data_bound = set()
        for text in self.spec.constraints:
            node = ast.parse(text, mode="eval").body
            if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.Eq):
                sides = [node.left, *node.comparators]
                if any(self._mentions_inputs(ast.unparse(s)) for s in sides):
                    data_bound |= {s.id for s in sides if isinstance(s, ast.Name)}
        unknown = [n for n, k, _ in self.spec.axes if k == "var" and n not in self.axes]
        for axis in unknown:
            if axis not in provided and axis not in data_bound:
                return axis
        return unknown[0] if unknown else None

    # -- main loop ------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        pending = [i[0] for i in self.spec.inputs]
        while pending:
            self._propagate()
            ready = next((p for p in pending if not self._needs(p)), None)
            if ready is not None:
                self.values[ready] = self._make(ready)
                pending.remove(ready)
                continue
            axis = self._pick_default(pending)
            if axis is None:
                waits = {p: sorted(self._needs(p)) for p in pending}
                raise InputGenerationError(
                    f"{self.spec.name}: cannot order input generation; waiting: {waits}"
                )
            self.axes[axis] = self._default_axis(axis)
        self._propagate()
        for name, kind, _ in self.spec.axes:
            if name not in self.axes:
                self.axes[name] = self._default_axis(name)
                self._propagate()
        self._check_constraints()
        return {i[0]: self.values[i[0]] for i in self.spec.inputs}

    def _check_constraints(self) -> None:
        for text in self.spec.constraints:
            result = self._eval(text, "constraint")
            ok = bool(result.all()) if isinstance(result, torch.Tensor) else bool(result)
            if ok:
                continue
            node = ast.parse(text, mode="eval").body
            parts = []
            if isinstance(node, ast.Compare):
                for side in [node.left, *node.comparators]:
                    side_text = ast.unparse(side)
                    if not isinstance(side, ast.Constant):
                        parts.append(f"{side_text} = {_show(self._eval(side_text, 'constraint'))}")
            else:
                env = self._env()
                parts = [f"{n} = {_show(env[n])}" for n in sorted(_names(text)) if n in env]
            raise InputGenerationError(
                f"{self.spec.name}: constraint `{text}` does not hold: {', '.join(parts)}"
            )

    # -- making one input ---------------------------------------------------------------

    def _arg(self, name: str, key: str, default: Any = None) -> Any:
        text = self.bound[name].get(key)
        if text is None:
            return default
        return self._eval(text, f"hint argument `{key}` of `{name}`")

    def _tensor_arg(self, name: str, key: str) -> torch.Tensor | None:
        text = self.bound[name].get(key)
        return None if text is None else self.values[_bare_name(text)]

    def _make(self, name: str) -> Any:
        _, dtype, shape_names, optional, hint = self.inputs[name]
        kind = hint[0] if hint else None
        if kind == "none":
            if not optional:
                raise InputGenerationError(
                    f"{self.spec.name}: `gen none()` on `{name}`, which is not optional"
                )
            return None
        if shape_names is None:
            return self._make_scalar(name, dtype, kind)
        if all(d in self.axes for d in shape_names):
            self._reserve(name, dtype, tuple(self.axes[d] for d in shape_names))
        if kind == "indptr":
            return self._make_indptr(name, dtype, shape_names)
        if kind == "last_page_len":
            return self._make_last_page_len(name, dtype, shape_names)
        if kind == "indices":
            return self._make_indices(name, dtype, shape_names)
        shape = tuple(self.axes[d] for d in shape_names)
        if kind == "sparse_indices":
            return self._make_sparse_indices(name, dtype, shape)
        if kind == "fp8_paged_with_scales":
            return self._make_fp8_paged(name, dtype, shape)
        if kind == "packed_topk":
            return self._make_packed_topk(name, dtype, shape)
        return self._make_plain(name, dtype, shape, kind)

    def _reserve(self, name: str, dtype: str, shape: tuple[int, ...]) -> None:
        """Count a tensor's bytes before it is made; refuse one that cannot fit."""
        numel = math.prod(shape)
        size = numel * DTYPE_BYTES[dtype]
        if self.memory is not None and self.nbytes + size > self.memory:
            before = f" (with the inputs before it, {format_bytes(self.nbytes + size)})"
            raise InputGenerationError(
                f"{self.spec.name}: input `{name}` of shape {list(shape)} ({dtype}) takes "
                f"{format_bytes(size)}{before if self.nbytes else ''}, more than this machine's "
                "free memory; give smaller var-axis values"
            )
        self.nbytes += size

    def _make_scalar(self, name: str, dtype: str, kind: str | None) -> Any:
        cast = bool if dtype == "bool" else int if dtype in _INT_DTYPES else float
        if kind == "value":
            return cast(self._arg(name, "value"))
        if kind == "range":
            lo, hi = self._arg(name, "lo"), self._arg(name, "hi")
            if cast is int:
                return int(torch.randint(int(lo), int(hi), (), generator=self.rng))
            return float(lo + (hi - lo) * torch.rand((), generator=self.rng))
        if kind is not None:
            raise InputGenerationError(
                f"{self.spec.name}: hint `{kind}` cannot make the scalar `{name}`; "
                f"use value(...) or range(lo, hi)"
            )
        if cast is bool:
            return bool(torch.randint(0, 2, (), generator=self.rng))
        if cast is int:
            return int(torch.randint(1, 5, (), generator=self.rng))
        return float(0.5 + torch.rand((), generator=self.rng))

    def _finish(self, x: torch.Tensor, dtype: str) -> torch.Tensor:
        if dtype == "float4_e2m1":
            raise InputGenerationError("float4_e2m1 tensors take only random or zero fills")
        return x.to(torch_dtype(dtype))

    def _random_bytes(self, shape: tuple) -> torch.Tensor:
        # 64-bit draws give eight bytes each: far cheaper than a draw per byte.
        n = math.prod(shape)
        words = torch.randint(
            -(2**63), 2**63 - 1, (-(-n // 8),), dtype=torch.int64, generator=self.rng
        )
        return words.view(torch.uint8)[:n].reshape(shape)

    def _make_plain(self, name: str, dtype: str, shape: tuple, kind: str | None) -> torch.Tensor:
        rng = self.rng
        if dtype == "float4_e2m1" and kind == "zeros":
            return torch.zeros(shape, dtype=torch.uint8).view(torch_dtype(dtype))
        if dtype == "float4_e2m1" and kind is None:
            # Note [fp4]: any byte is two valid e2m1 values.
            return self._random_bytes(shape).view(torch_dtype(dtype))
        if dtype in _FP8_BITS and kind is None:
            keep, fixed = _FP8_BITS[dtype]  # Note [fp8 from bits]
            raw = self._random_bytes(shape)
            raw &= keep
            raw |= fixed
            return raw.view(torch_dtype(dtype))
        if kind is None:
            if dtype == "bool":
                return torch.randint(0, 2, shape, generator=rng).bool()
            if dtype in _INT_DTYPES:
                return torch.randint(0, 4, shape, generator=rng).to(torch_dtype(dtype))
            return self._finish(torch.randn(shape, generator=rng), dtype)
        if kind == "zeros":
            return torch.zeros(shape, dtype=torch_dtype(dtype))
        if kind == "ones":
            return self._finish(torch.ones(shape), dtype)
        if kind == "value":
            return self._finish(torch.full(shape, self._arg(name, "value")), dtype)
        if kind == "normal":
            mean, std = self._arg(name, "mean", 0.0), self._arg(name, "std", 1.0)
            return self._finish(torch.randn(shape, generator=rng) * std + mean, dtype)
        if kind == "range":
            lo, hi = self._arg(name, "lo"), self._arg(name, "hi")
            if dtype in _INT_DTYPES:
                if int(hi) <= int(lo):
                    raise InputGenerationError(
                        f"{self.spec.name}: range({lo}, {hi}) for `{name}` is empty"
                    )
                x = torch.randint(int(lo), int(hi), shape, generator=rng)
                return x.to(torch_dtype(dtype))
            return self._finish(lo + (hi - lo) * torch.rand(shape, generator=rng), dtype)
        if kind == "prob":
            temperature = self._arg(name, "temperature", 1.0)
            x = torch.randn(shape, generator=rng) / temperature
            return self._finish(torch.softmax(x, dim=-1), dtype)
        if kind == "arange":
            start, step = self._arg(name, "start", 0), self._arg(name, "step", 1)
            x = torch.arange(math.prod(shape)).reshape(shape) * step + start
            return self._finish(x, dtype)
        raise InputGenerationError(f"{self.spec.name}: hint `{kind}` does not apply to `{name}`")

    def _segments_of(self, indptr: torch.Tensor, n: int, what: str) -> list[int]:
        seg = (indptr[1:] - indptr[:-1]).tolist()
        if len(seg) != n:
            raise InputGenerationError(
                f"{self.spec.name}: {what} describes {len(seg)} sequences, expected {n}"
            )
        return seg

    def _make_indptr(self, name: str, dtype: str, shape_names: tuple) -> torch.Tensor:
        if len(shape_names) != 1:
            raise InputGenerationError(f"{self.spec.name}: indptr `{name}` must be 1-D")
        length = self.axes[shape_names[0]]
        if length < 1:
            raise InputGenerationError(f"{self.spec.name}: indptr `{name}` needs length >= 1")
        n = length - 1
        over = _bare_name(self.bound[name]["over"])
        total_axis = self._first_axis(over)
        min_len = int(self._arg(name, "min_len", DEFAULT_MIN_LEN))
        max_len = int(self._arg(name, "max_len", max(DEFAULT_MAX_LEN, min_len)))
        unit = int(self._arg(name, "unit", 1))
        lower = [min_len] * n
        other = self._tensor_arg(name, "at_least")
        if other is not None:
            other_seg = self._segments_of(other, n, f"`{name}`'s at_least")
            lower = [max(lo, -(-o // unit)) for lo, o in zip(lower, other_seg)]
        if total_axis in self.axes:
            total = self.axes[total_axis]
            spare = total - sum(lower)
            if spare < 0:
                raise InputGenerationError(
                    f"{self.spec.name}: cannot split {total_axis} = {total} rows into {n} "
                    f"segments for `{name}`: they need at least {sum(lower)}"
                )
            # Random cut points spread the spare rows over the segments.
            cuts = torch.randint(0, spare + 1, (max(n - 1, 0),), generator=self.rng)
            bounds = [0, *sorted(cuts.tolist()), spare] if n else [0]
            seg = [lo + bounds[i + 1] - bounds[i] for i, lo in enumerate(lower)]
            if n == 0 and total != 0:
                raise InputGenerationError(
                    f"{self.spec.name}: `{name}` has no segments but {total_axis} = {total}"
                )
        else:
            draw = torch.randint(min_len, max_len + 1, (n,), generator=self.rng).tolist()
            if other is None:
                seg = [max(lo, d) for lo, d in zip(lower, draw)]
            else:
                # Paired with another indptr (causal kv over q): its length plus a few more.
                seg = [lo + d - min_len for lo, d in zip(lower, draw)]
            self.axes[total_axis] = sum(seg)
        offsets = [0]
        for s in seg:
            offsets.append(offsets[-1] + s)
        return torch.tensor(offsets, dtype=torch_dtype(dtype))

    def _make_last_page_len(self, name: str, dtype: str, shape_names: tuple) -> torch.Tensor:
        indptr = self._tensor_arg(name, "indptr")
        pages = (indptr[1:] - indptr[:-1]).tolist()
        n = len(pages)
        page_size = int(self._arg(name, "page_size"))
        if shape_names[0] not in self.axes:
            self.axes[shape_names[0]] = n
        length = self.axes[shape_names[0]]
        if length < n:
            raise InputGenerationError(
                f"{self.spec.name}: `{name}` has {length} entries but the indptr describes "
                f"{n} sequences"
            )
        lower = [1] * n
        queries = self._tensor_arg(name, "at_least")
        if queries is not None:
            q = self._segments_of(queries, n, f"`{name}`'s at_least")
            lower = [max(1, qi - (p - 1) * page_size) for qi, p in zip(q, pages)]
            for i, lo in enumerate(lower):
                if pages[i] and lo > page_size:
                    raise InputGenerationError(
                        f"{self.spec.name}: sequence {i} has {q[i]} queries but only "
                        f"{pages[i]} pages of {page_size} tokens"
                    )
        out = []
        for i in range(length):
            if i < n and pages[i] == 0:
                out.append(0)  # an empty sequence has no last page
                continue
            lo = lower[i] if i < n else 1
            out.append(int(torch.randint(lo, page_size + 1, (), generator=self.rng)))
        return torch.tensor(out, dtype=torch_dtype(dtype)).reshape(
            tuple(self.axes[d] for d in shape_names)
        )

    def _make_indices(self, name: str, dtype: str, shape_names: tuple) -> torch.Tensor:
        shape = tuple(self.axes[d] for d in shape_names)
        unique = bool(self._arg(name, "unique", False))
        row = shape[-1] if shape else 1
        bare = _bare_name(self.bound[name]["below"])
        if bare in self.kinds and bare not in self.axes:
            self.axes[bare] = max(self._default_axis(bare), row if unique else 1)
        below = int(self._arg(name, "below"))
        if unique and row > below:
            raise InputGenerationError(
                f"{self.spec.name}: `{name}` needs {row} distinct values per row but only "
                f"{below} are below `{self.bound[name]['below']}`"
            )
        if below <= 0 and math.prod(shape) > 0:
            raise InputGenerationError(
                f"{self.spec.name}: `{name}` needs indices below {below}: nothing to pick"
            )
        if not unique:
            x = torch.randint(0, max(below, 1), shape, generator=self.rng)
        else:
            rows = math.prod(shape[:-1]) if shape else 1
            if rows * below <= 1 << 24:
                x = torch.rand((rows, below), generator=self.rng).argsort(dim=-1)[:, :row]
            else:
                x = torch.stack(
                    [torch.randperm(below, generator=self.rng)[:row] for _ in range(rows)]
                )
            x = x.reshape(shape)
        return x.to(torch_dtype(dtype))

    def _make_sparse_indices(self, name: str, dtype: str, shape: tuple) -> torch.Tensor:
        below = int(self._arg(name, "below"))
        min_valid = int(self._arg(name, "min_valid", 1))
        k = shape[-1]
        rows = math.prod(shape[:-1])
        cap = min(k, below)
        out = torch.full((rows, k), -1, dtype=torch.int64)
        for r in range(rows):
            count = int(torch.randint(min(min_valid, cap), cap + 1, (), generator=self.rng))
            out[r, :count] = torch.randperm(below, generator=self.rng)[:count]
        return out.reshape(shape).to(torch_dtype(dtype))

    def _make_fp8_paged(self, name: str, dtype: str, shape: tuple) -> torch.Tensor:
        if len(shape) != 4 or shape[-1] <= 4 or dtype != "int8":
            raise InputGenerationError(
                f"{self.spec.name}: fp8_paged_with_scales wants an int8 tensor "
                f"[pages, page_size, heads, dim + 4], got {dtype}{list(shape)} for `{name}`"
            )
        pages, page_size, heads, width = shape
        dim = width - 4
        values = torch.randn((pages, page_size * heads * dim), generator=self.rng)
        fp8 = values.to(torch.float8_e4m3fn).view(torch.uint8)
        scales = 0.01 + 0.09 * torch.rand((pages, page_size * heads), generator=self.rng)
        scale_bytes = scales.to(torch.float32).view(torch.uint8)
        raw = torch.cat([fp8, scale_bytes], dim=1).reshape(shape)
        return raw.view(torch_dtype(dtype))

    def _make_packed_topk(self, name: str, dtype: str, shape: tuple) -> torch.Tensor:
        experts = int(self._arg(name, "num_experts"))
        if dtype != "int32" or not shape:
            raise InputGenerationError(
                f"{self.spec.name}: packed_topk wants an int32 tensor [..., top_k], got "
                f"{dtype}{list(shape)} for `{name}`"
            )
        k = shape[-1]
        if k > experts:
            raise InputGenerationError(
                f"{self.spec.name}: `{name}` needs {k} distinct experts per row but there are "
                f"only {experts}"
            )
        rows = math.prod(shape[:-1])
        ids = torch.rand((rows, experts), generator=self.rng).argsort(dim=-1)[:, :k]
        weights = torch.softmax(torch.randn((rows, k), generator=self.rng), dim=-1)
        # A positive bfloat16 has its sign bit clear, so its bits fill the low half exactly.
        bits = weights.to(torch.bfloat16).view(torch.int16).to(torch.int32)
        return ((ids.to(torch.int32) << 16) | bits).reshape(shape)
