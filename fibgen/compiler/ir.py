"""The typed IR of a `.fidef` module.

Two levels:

* the *family* level (``Family``, ``DispatchGroup``) mirrors the source: axes may be
  generic (const values come from instances), tensors may use a dtype parameter or copy the
  dtype of an input. ``fibgen fmt`` prints this level back to source.
* the *definition* level (``Definition``) is one concrete instance: every const axis has a
  value, every dtype is concrete, the name is computed. Code generators read this level
  (plus the family it came from for API-facing code).

Every node carries a ``span``. Spans compare equal to each other, so two IRs parsed from
differently formatted sources are equal when they mean the same thing (see Note [spans]).
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

# The dtypes of the FlashInfer Trace format: one list for the format and the compiler.
from fibgen.format.models import DTYPES  # noqa: F401  (ir.DTYPES is the compiler's name for it)

# Short spellings used as the dtype part of a definition name for dtype-generic families.
DTYPE_NAME_PART: dict[str, str] = {
    "float32": "fp32",
    "float16": "fp16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "fp8e4m3",
    "float8_e5m2": "fp8e5m2",
    "float4_e2m1": "fp4",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "bool": "bool",
}


class _Node(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Span(_Node):
    """Where a node came from: 1-based line and column, end exclusive.

    Note [spans]: a span never takes part in equality or hashing. ``parse(fmt(x))`` must
    equal ``parse(x)`` although every position moved, and IR nodes are compared whole in
    tests; making spans compare equal keeps both simple.
    """

    file: str
    line: int
    column: int
    end_line: int
    end_column: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Span)

    def __hash__(self) -> int:
        return 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


NO_SPAN = Span(file="<builtin>", line=0, column=0, end_line=0, end_column=0)


class Node(_Node):
    span: Span = Field(default=NO_SPAN, repr=False)


# ---------------------------------------------------------------------------------------
# Expressions are kept as Python source text, validated with ``ast`` at lowering time.
# ---------------------------------------------------------------------------------------


class Expr(Node):
    """A Python expression over axes, parameters and inputs, kept as written."""

    text: str


# ---------------------------------------------------------------------------------------
# Axes
# ---------------------------------------------------------------------------------------


class VarAxis(Node):
    """A var axis: its value is read from a call.

    ``scalar`` False: from the shape of an input that carries it. ``scalar`` True
    (``n : var scalar``): it is the value of the integer scalar input of the same name (Note
    [axes bound by a scalar]).
    """

    kind: Literal["var"] = "var"
    name: str
    scalar: bool = False
    description: str | None = None


# Note [axes bound by a scalar]
# Most var axes are sizes of input tensors. Some kernels size an output by an integer argument
# instead (FlashInfer's `fp8_paged_mqa_logits(..., max_seq_len)` returns `[rows, max_seq_len]`
# logits), and no input carries that width. FlashInfer's trace templates bind such an axis by
# name: a `Var` axis and a `Scalar` input of the same name, the axis taking the argument's
# value. The definition JSON keeps that convention (a var axis and an integer scalar input of
# one name; flashinfer-bench loads it unchanged), so fibgen reads it the same way wherever a
# definition is read: a var axis that no input's shape carries, and that an integer scalar input
# is named like, is that input's value (`var_axis_scalars` in fibgen/format/models/definition.py:
# input generation makes the scalar equal to the axis, a call's var-axis key and the output
# buffers read it). In a `.fidef` the binding is written, `max_seq_len : var scalar`, so that
# the checker can hold it to the convention: the input exists, is a required integer scalar
# without a generation hint, and no input's shape carries the axis too.


class ConstAxis(Node):
    """A const axis.

    ``abbrev`` set: the axis contributes ``<abbrev><value>`` to the definition name.
    ``abbrev`` None: no name part. ``value`` set: pinned (an int literal or an expression
    over other consts and parameters); otherwise every instance gives the value.
    """

    kind: Literal["const"] = "const"
    name: str
    abbrev: str | None = None
    value: Expr | None = None
    description: str | None = None


Axis = Annotated[Union[VarAxis, ConstAxis], Field(discriminator="kind")]


class Param(Node):
    """A family parameter: a per-instance Python constant that is not an axis.

    Parameters may appear in name templates and are defined as module-level constants at
    the top of the instance's reference (e.g. MoE ``top_k``). ``default`` is the value of
    instances that give none (``params { EPS = 1e-6 }``).
    """

    name: str
    abbrev: str | None = None
    default: int | float | str | bool | None = None
    description: str | None = None


class DtypeParam(Node):
    """``dtype T in {bfloat16, float16}``: the family is generic over dtype."""

    name: str
    choices: tuple[str, ...]


# ---------------------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------------------


class DtypeRef(Node):
    """A dtype as written: a concrete dtype, a dtype parameter, or ``dtype(input)``."""

    kind: Literal["concrete", "param", "from"]
    name: str  # the dtype, the parameter name, or the input name


class Source(Node):
    """Where a tensor is read from in the API call: ``<- [plan.]param[index]``."""

    param: str
    index: int | None = None
    from_plan: bool = False


class GenHint(Node):
    """An input-generation hint: ``gen kind(args, key=value)``; values are expressions."""

    kind: str
    args: tuple[Expr, ...] = ()
    kwargs: tuple[tuple[str, Expr], ...] = ()


class Tensor(Node):
    """An input or output. ``shape`` None is a Python scalar; ``()`` is a 0-D tensor."""

    name: str
    dtype: DtypeRef
    shape: tuple[str, ...] | None
    optional: bool = False
    source: Source | None = None  # inputs only
    target: str | None = None  # outputs only: the API buffer written (``-> out``)
    gen: GenHint | None = None  # inputs only
    description: str | None = None
    dim_spans: tuple[Span, ...] = Field(default=(), repr=False)  # one per shape entry


# ---------------------------------------------------------------------------------------
# API signatures
# ---------------------------------------------------------------------------------------


ParamKind = Literal["positional", "keyword_only", "var_positional", "var_keyword"]


class ApiParam(Node):
    name: str
    kind: ParamKind
    default: str | None = None  # Python source of the default, None when required


class ApiSignature(Node):
    """``api flashinfer.norm.rmsnorm(input, weight, eps=1e-6, out=None)``."""

    path: str  # dotted path of the callable (``pkg.mod.Class.method`` for methods)
    params: tuple[ApiParam, ...]

    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)


# ---------------------------------------------------------------------------------------
# Rules: how a call of the API is held to the definition (Note [rules])
# ---------------------------------------------------------------------------------------
#
# Note [rules]
# Every parameter of an `api` or `plan` line is accounted for: read by an input, written by
# an output or an effect, the selector of a dispatch group, the flag that asks for an
# output (`return_lse`), named like a const axis or parameter of the family (the call must
# then agree with the definition), or covered by a rule. A rule is one line of a family's
# `rules { ... }` block:
#
#   eps == EPS                           Require: route only when the expression is true.
#   ignore enable_pdl "launch option"    Ignore: the parameter cannot change the results.
#   default plan.sm_scale = 1 / sqrt(plan.head_dim)
#                                        Default: the value a None stands for.
#   let paged_kv_cache = kv_pair(...)    Let: the value the definition reads instead of the
#                                        argument (a layout converted by a view), or a new
#                                        name that an input may read.
#   result samples = samples.to(torch.int32)
#                                        Result: what a routed call returns for an output
#                                        where the API's convention differs from the
#                                        definition's (FlashInfer samples are int32).
#   keywords plan.kwargs = pkg.Cls._plan_impl(window_left=-1, ...)
#                                        Keywords: what a `**kwargs` parameter may carry,
#                                        with the defaults of the function it forwards to;
#                                        each becomes a parameter to account for, and a
#                                        keyword outside the list is a call not routed.
#
# Names in rule expressions: API parameters as they are; `plan.x` for a parameter of the
# plan method; `self` for the wrapper; const axes and family parameters (the definition's
# values); `torch`, `math` and the expression builtins. When an API parameter and an axis or
# parameter share a name, the name means the API parameter. A call that fails a rule goes to
# the original API (counted as `fallback_guard` with the rule's name: the parameters it
# reads, Note [rule names] in rules.py), or raises in strict mode. Rules over plan
# parameters alone are checked once, at plan; rules over const values alone once per key;
# the rest on every routed call.


class Require(Node):
    """A condition a call must meet to be routed: ``eps == EPS``."""

    kind: Literal["require"] = "require"
    expr: Expr


class Ignore(Node):
    """Parameters that cannot change the results: ``ignore enable_pdl "launch option"``."""

    kind: Literal["ignore"] = "ignore"
    names: tuple[str, ...]
    name_spans: tuple[Span, ...] = Field(default=(), repr=False)
    reason: str | None = None


class Default(Node):
    """The value a None argument stands for: ``default plan.sm_scale = 1 / sqrt(...)``."""

    kind: Literal["default"] = "default"
    target: str
    target_span: Span = Field(default=NO_SPAN, repr=False)
    expr: Expr


class Let(Node):
    """What the definition reads instead of an argument, or a new name inputs may read."""

    kind: Literal["let"] = "let"
    target: str
    target_span: Span = Field(default=NO_SPAN, repr=False)
    expr: Expr


class Result(Node):
    """An output as the API returns it: ``result samples = samples.to(torch.int32)``."""

    kind: Literal["result"] = "result"
    target: str
    target_span: Span = Field(default=NO_SPAN, repr=False)
    expr: Expr


class Keywords(Node):
    """What a ``**kwargs`` parameter may carry: ``keywords plan.kwargs = path(a=1, ...)``."""

    kind: Literal["keywords"] = "keywords"
    target: str
    target_span: Span = Field(default=NO_SPAN, repr=False)
    path: str  # the function the keywords are forwarded to (checked against the package)
    params: tuple["ApiParam", ...]


Rule = Annotated[
    Union[Require, Ignore, Default, Let, Result, Keywords], Field(discriminator="kind")
]


class Effect(Node):
    """``effect residual = hidden_states + residual``: what a routed call also writes.

    The API argument ``target`` receives ``expr``, a Python expression over the definition's
    inputs as they were before the call. For effects of the API that the definition does
    not expose as outputs (see Note [effects] in ``fibgen/codegen/python/dispatch/emit.py``).
    """

    target: str
    target_span: Span = Field(default=NO_SPAN, repr=False)
    expr: Expr


class Returns(Node):
    """``returns output, new_state``: what a call of the API returns, in order.

    Note [returns]
    Without the statement a dispatcher returns fibgen's convention: every output that is
    not written into an input, one bare or several as a tuple, and an output a flag asks for
    (``return_lse``) after them when asked. An API whose result differs says what it
    returns instead: each name is an output; an output written into a buffer of the caller
    (``-> output``) is returned as that buffer (a new one where the call gave none), and an
    output written into an input (``-> state``) as the caller's own tensor, the one the API
    wrote, so that the result is what FlashInfer's own function returns
    (``gated_delta_rule_decode`` gives ``(output, state)``). One name returns the value
    bare, several a tuple, and ``returns none`` (``names`` empty) returns None. Outputs a
    flag asks for still follow when asked. This is dispatch information only: the
    definition JSON does not carry it.
    """

    names: tuple[str, ...]
    name_spans: tuple[Span, ...] = Field(default=(), repr=False)


class Tolerance(Node):
    atol: float | None = None
    rtol: float | None = None
    matched: float | None = None  # required ratio of matching elements


# ---------------------------------------------------------------------------------------
# Families, instances and dispatch groups
# ---------------------------------------------------------------------------------------


class Assignment(Node):
    """``h = 4096`` in an instance: ``key`` is an axis abbrev, axis name or parameter."""

    key: str
    value: int | float | str | bool


class Instance(Node):
    values: tuple[Assignment, ...]
    tags: tuple[str, ...] = ()
    description: str | None = None
    reference: str | None = None  # replaces the family's reference for this instance
    reference_span: Span = Field(default=NO_SPAN, repr=False)


class Family(Node):
    name: str
    name_span: Span = Field(default=NO_SPAN, repr=False)
    op_type: str
    description: str | None = None
    tags: tuple[str, ...] = ()
    name_template: str | None = None  # ``name "gdn_decode_qk{num_q_heads}_..._k_last"``
    name_template_span: Span = Field(default=NO_SPAN, repr=False)
    api: ApiSignature | None = None
    no_api: str | None = None  # ``api none "why"``: why the family stands for no API
    returns: Returns | None = None  # None: the default convention (Note [returns])
    effects: tuple[Effect, ...] = ()
    plan: ApiSignature | None = None
    rules: tuple[Rule, ...] = ()
    dtype_params: tuple[DtypeParam, ...] = ()
    params: tuple[Param, ...] = ()
    axes: tuple[Axis, ...] = ()
    constraints: tuple[Expr, ...] = ()
    inputs: tuple[Tensor, ...] = ()
    outputs: tuple[Tensor, ...] = ()
    reference: str | None = None
    reference_span: Span = Field(default=NO_SPAN, repr=False)
    tolerance: Tolerance | None = None
    requires: tuple[str, ...] = ()  # e.g. ("sm90",): compute capability 9.0 or newer
    instances: tuple[Instance, ...] = ()


class DispatchCase(Node):
    """``2 -> fam_a, fam_b``: the selector value and its families, tried in order."""

    value: int | str
    family: str
    also: tuple[str, ...] = ()

    @property
    def families(self) -> tuple[str, ...]:
        return (self.family,) + self.also


class DispatchGroup(Node):
    """``dispatch API on ARG { value -> family ... }``: one API, several families."""

    name: str
    name_span: Span = Field(default=NO_SPAN, repr=False)
    selector: str
    cases: tuple[DispatchCase, ...]


class Unroutable(Node):
    """``unroutable flashinfer.comm.allreduce_fusion "why"``: a traced entry point of
    FlashInfer that no family routes, declared with the reason none can (Note [declared
    entry points])."""

    path: str
    path_span: Span = Field(default=NO_SPAN, repr=False)
    reason: str


# Note [declared entry points]
# Every API entry point FlashInfer traces is accounted for by the catalogue: routed (a
# family's `api` or `plan` line names it) or declared unroutable with the reason, so that
# what apply can never substitute is said rather than left out (`fibgen list --apis`,
# `fibgen/compiler/coverage.py`). A declaration stands on its own, at the top level of a
# file: it belongs to no family (a family that cannot route says `api none "why"` instead),
# and names the entry point by any path that reaches the function (a re-export such as
# `flashinfer.comm.allreduce_fusion`). The checker refuses a path declared twice and one that a
# family routes; where FlashInfer's source is given to the compiler, also a path that is no
# traced entry point of it (`fibgen/compiler/checks/unroutable.py`).


Item = Annotated[Union[Family, DispatchGroup, Unroutable], Field(discriminator=None)]


class SourceFile(Node):
    """One parsed `.fidef` file."""

    path: str
    families: tuple[Family, ...] = ()
    dispatches: tuple[DispatchGroup, ...] = ()
    unroutables: tuple[Unroutable, ...] = ()


# ---------------------------------------------------------------------------------------
# The definition level: one concrete instance of a family.
# ---------------------------------------------------------------------------------------


class DefAxis(Node):
    name: str
    kind: Literal["var", "const"]
    value: int | None = None
    scalar: bool = False  # a var axis bound by the scalar input of its name
    description: str | None = None


class DefTensor(Node):
    name: str
    dtype: str
    shape: tuple[str, ...] | None
    optional: bool = False
    description: str | None = None


class Definition(Node):
    """A concrete definition: what becomes one FlashInfer Trace definition JSON."""

    name: str
    op_type: str
    description: str | None
    tags: tuple[str, ...]
    axes: tuple[DefAxis, ...]
    constraints: tuple[str, ...]
    inputs: tuple[DefTensor, ...]
    outputs: tuple[DefTensor, ...]
    reference: str | None
    # Where it came from, for diagnostics and for generators that need the family.
    family: str
    source_file: str
    instance_index: int
    consts: tuple[tuple[str, int], ...] = ()  # const axis values, declaration order
    param_values: tuple[tuple[str, int | float | str | bool], ...] = ()
    dtype_values: tuple[tuple[str, str], ...] = ()  # dtype parameter bindings


class Module(Node):
    """Everything compiled in one run: the files, and the definitions they produce."""

    files: tuple[SourceFile, ...]
    definitions: tuple[Definition, ...]

    def families(self) -> tuple[Family, ...]:
        return tuple(f for sf in self.files for f in sf.families)

    def dispatches(self) -> tuple[DispatchGroup, ...]:
        return tuple(d for sf in self.files for d in sf.dispatches)

    def unroutables(self) -> tuple[Unroutable, ...]:
        return tuple(u for sf in self.files for u in sf.unroutables)
