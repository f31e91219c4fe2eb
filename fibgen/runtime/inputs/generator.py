"""The generator of one definition's inputs: the order they are made in, the var-axis values
they leave open, and the constraints they must meet."""

from __future__ import annotations

import ast
from typing import Any, cast

import torch

from fibgen.format.expressions import BUILTIN_NAMES, EvaluationError, ExpressionError, evaluate
from fibgen.format.hints import DEFAULT_VAR_AXIS, HINT_SIGNATURES, bind_hint
from fibgen.runtime.inputs.fills import Fills
from fibgen.runtime.inputs.sizes import available_memory
from fibgen.runtime.inputs.specs import InputGenerationError, InputSpec, bare_name, names

# Hint and constraint expressions are not Python: they are evaluated by the interpreter of
# the checked language (Note [checked expressions] in fibgen/format/expressions.py).
_ARRAYS = (torch.Tensor,)


def _show(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        if value.numel() <= 8:
            return f"tensor({value.tolist()})"
        return f"tensor of shape {list(value.shape)}"
    return repr(value)


_SCAN = 4096  # values above the default tried one by one where no power of two holds


class Generator(Fills):
    """Makes one definition's inputs: derives the var axes, orders the inputs, checks the
    constraints; ``Fills`` makes each input."""

    def __init__(self, spec: InputSpec, given: dict[str, int], seed: int) -> None:
        self.spec = spec
        self.rng = torch.Generator(device="cpu").manual_seed(seed)
        self.kinds = {n: k for n, k, _ in spec.axes}
        self.axes: dict[str, int] = {
            n: int(cast(int, v)) for n, k, v in spec.axes if k == "const"  # const: has a value
        }
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
        # Scalar inputs that are the value of a var axis of their name: made equal to it
        # (Note [axes bound by a scalar] in fibgen/compiler/ir.py).
        self.axis_scalars = set(spec.scalar_axes().values())
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
        return bool(names(text) & set(self.inputs))

    def _env(self) -> dict[str, Any]:
        env: dict[str, Any] = dict(self.spec.params)
        env.update(self.axes)
        env.update(self.values)
        return env

    def _known(self, name: str) -> bool:
        return (
            name in self.axes
            or name in self.values
            or name in self.spec.params
            or (name in BUILTIN_NAMES and name not in self.kinds and name not in self.inputs)
        )

    def _check_names(self, text: str, where: str) -> None:
        for name in names(text):
            if not (
                name in self.kinds
                or name in self.inputs
                or name in self.spec.params
                or name in BUILTIN_NAMES
            ):
                raise InputGenerationError(
                    f"{self.spec.name}: {where} `{text}` uses `{name}`, which is not an axis, "
                    f"parameter or input"
                )

    def _eval(self, text: str, where: str, env: dict[str, Any] | None = None) -> Any:
        try:
            return evaluate(text, self._env() if env is None else env, _ARRAYS)
        except (EvaluationError, ExpressionError) as e:  # reported in the user's terms
            raise InputGenerationError(
                f"{self.spec.name}: cannot evaluate {where} `{text}`: {e}"
            ) from None

    # -- axis derivation ----------------------------------------------------------------

    def _unknown_axes(self, text: str) -> set[str]:
        return {n for n in names(text) if n in self.kinds and n not in self.axes}

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
            return self._eval(expr, "constraint", env)

        try:
            f0, f1, f2 = f(0), f(1), f(2)
        except InputGenerationError:
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
            c for c in self.axis_constraints if axis in names(c) and self._unknown_axes(c) == {axis}
        ]

        def holds(x: int) -> bool:
            env = self._env()
            env[axis] = x
            try:
                return all(self._eval(c, "constraint", env) for c in relevant)
            except InputGenerationError:
                return False

        x = DEFAULT_VAR_AXIS
        if not relevant or holds(x):
            return x
        hi = x
        while not holds(hi):
            hi *= 2
            if hi > 2**31:
                # No power of two holds: a constraint met at single values
                # (`heads == 1 or heads == num_kv_heads`) is found by a short scan.
                scan = [*range(x, x + _SCAN), *range(x - 1, 0, -1)]  # above, then below
                found = next((v for v in scan if holds(v)), None)
                # Otherwise unsatisfiable from here: the constraint check will report it.
                return x if found is None else found
        lo = hi // 2
        while lo + 1 < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if holds(mid) else (mid, hi)
        return hi

    # -- hint bookkeeping ---------------------------------------------------------------

    def _first_axis(self, tensor: str) -> str:
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
            return {self._first_axis(bare_name(b["over"]) or b["over"])}
        if hint[0] == "last_page_len" and shape:
            return {shape[0]}
        if hint[0] == "indices":
            bare = bare_name(b["below"])
            if bare in self.kinds and self.kinds[bare] == "var":
                return {bare}
        return set()

    def _needs(self, name: str) -> set[str]:
        """Unknown axes and ungenerated inputs that input ``name`` waits for."""
        if name in self.axis_scalars:
            return set() if name in self.axes else {name}  # the axis of its name
        _, _, shape, _, hint = self.inputs[name]
        provided = self._provides(name)
        texts: list[str] = list(shape or ())
        if hint is not None:
            sig = HINT_SIGNATURES[hint[0]]
            for key, text in self.bound[name].items():
                if key in sig.tensor_params:
                    ref = bare_name(text)
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
            for n in names(text):
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
        for name, _kind, _ in self.spec.axes:
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
                parts = [f"{n} = {_show(env[n])}" for n in sorted(names(text)) if n in env]
            raise InputGenerationError(
                f"{self.spec.name}: constraint `{text}` does not hold: {', '.join(parts)}"
            )
