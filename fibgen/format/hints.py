"""The input-generation hints of the `.fidef` language, as plain data.

A tensor declares how valid values for it are made with ``gen kind(args, key=expr)``.
The compiler checks a hint against ``HINT_SIGNATURES`` (so a typo is a compile error with a
position); the runtime (``fibgen.runtime.inputs.make``) gives each kind its meaning. This module
imports neither torch nor the compiler, so both sides can use it cheaply.

Arguments are expressions of the checked language of ``fibgen.format.expressions`` (Note
[checked expressions]) over axes and parameters, except the parameters listed in
``HintSignature.tensor_params``: those name another input tensor (``indptr(over=kv_indices)``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from fibgen.format.expressions import ExpressionError, check_expression

# The size input generation gives a var axis that neither the caller, a constraint nor a hint
# sets; test generation sizes its cases with the same number.
DEFAULT_VAR_AXIS = 4


@dataclass(frozen=True)
class HintSignature:
    """The parameters of one hint kind.

    ``positional`` may be given by position or by keyword, ``keywords`` only by keyword;
    ``required`` lists those that must be given; ``tensor_params`` those whose value is the
    name of another input rather than an expression.
    """

    positional: tuple[str, ...]
    keywords: tuple[str, ...]
    required: tuple[str, ...]
    meaning: str
    tensor_params: tuple[str, ...] = ()
    scalar_ok: bool = False  # may be used on a Python scalar (``shape: null``) input

    def params(self) -> tuple[str, ...]:
        """Every parameter name, positional ones first."""
        return self.positional + self.keywords


HINT_SIGNATURES: dict[str, HintSignature] = {
    "indptr": HintSignature(
        positional=("over",),
        keywords=("min_len", "max_len", "at_least", "unit"),
        required=("over",),
        tensor_params=("over", "at_least"),
        meaning=(
            "offsets 0 <= ... <= len(over) of n+1 segments; each segment holds min_len..max_len "
            "rows (default 1..8) and, with at_least=OTHER_INDPTR, at least ceil(other/unit) rows; "
            "an N-D indptr chains its rows (last dim), each starting where the one before ends"
        ),
    ),
    "indices": HintSignature(
        positional=("below",),
        keywords=("unique",),
        required=("below",),
        meaning="integers in [0, below); unique=True makes each row (last dim) free of repeats",
    ),
    "bsr_indices": HintSignature(
        positional=("indptr", "below"),
        keywords=(),
        required=("indptr", "below"),
        tensor_params=("indptr",),
        meaning=(
            "the column blocks of a BSR matrix: each segment of INDPTR (each row of an N-D "
            "one, offsets absolute into this tensor) holds distinct, ascending integers in "
            "[0, below)"
        ),
    ),
    "sparse_indices": HintSignature(
        positional=("below",),
        keywords=("min_valid", "ascending"),
        required=("below",),
        meaning=(
            "per row, distinct integers in [0, below) followed by -1 padding; at least "
            "min_valid (default 1) valid entries per row; ascending=True sorts them"
        ),
    ),
    "last_page_len": HintSignature(
        positional=("indptr", "page_size"),
        keywords=("at_least",),
        required=("indptr", "page_size"),
        tensor_params=("indptr", "at_least"),
        meaning=(
            "tokens in each sequence's last page, in 1..page_size; with at_least=QO_INDPTR the "
            "sequence holds at least as many tokens as its queries (causal prefill)"
        ),
    ),
    "value": HintSignature(
        positional=("value",),
        keywords=(),
        required=("value",),
        scalar_ok=True,
        meaning="this exact value (a scalar, or a tensor filled with it)",
    ),
    "prob": HintSignature(
        positional=(),
        keywords=("temperature",),
        required=(),
        meaning="rows (last dim) that are probability distributions: non-negative, sum to 1",
    ),
    "range": HintSignature(
        positional=("lo", "hi"),
        keywords=(),
        required=("lo", "hi"),
        scalar_ok=True,
        meaning="uniform in [lo, hi); integers lo..hi-1 for integer dtypes",
    ),
    "normal": HintSignature(
        positional=("mean", "std"),
        keywords=(),
        required=(),
        meaning="normally distributed with this mean and standard deviation (default 0, 1)",
    ),
    "zeros": HintSignature((), (), (), "all zeros"),
    "ones": HintSignature((), (), (), "all ones"),
    "arange": HintSignature(
        positional=("start", "step"),
        keywords=(),
        required=(),
        meaning="start, start + step, ... in row-major order (positions, ids)",
    ),
    "fp8_paged_with_scales": HintSignature(
        positional=(),
        keywords=(),
        required=(),
        meaning=(
            "int8/uint8 bytes of a paged FP8 cache in DeepGEMM's layout "
            "[pages, page_size, 1, dim + 4]: per page, page_size * dim FP8 values, then "
            "page_size positive float32 scales"
        ),
    ),
    "mxfp4_paged_with_scales": HintSignature(
        positional=(),
        keywords=(),
        required=(),
        meaning=(
            "int8/uint8 bytes of a paged MXFP4 cache in FlashInfer's fused layout "
            "[pages, page_size, 1, dim / 2 + 4]: per page, page_size * dim / 2 bytes of two "
            "E2M1 codes each, then page_size int32 of four UE8M0 scale bytes (scales 1/128 to 8)"
        ),
    ),
    "ue8m0_packed": HintSignature(
        positional=(),
        keywords=(),
        required=(),
        meaning=(
            "int32 values of four packed UE8M0 scale bytes (the float32 exponent bytes of "
            "scales 1/128 to 8), as FlashInfer's MXFP4 scale factors"
        ),
    ),
    "packed_topk": HintSignature(
        positional=("num_experts",),
        keywords=(),
        required=("num_experts",),
        meaning=(
            "int32 rows of pre-computed MoE routing, one entry per chosen expert: "
            "(expert id << 16) | bfloat16 bits of its weight; the ids of a row are distinct "
            "and in [0, num_experts), the weights positive and summing to 1"
        ),
    ),
    "none": HintSignature(
        (), (), (), "pass None (for optional inputs that a test leaves out)", scalar_ok=True
    ),
}


class HintError(ValueError):
    """A hint whose arguments do not fit its signature."""


def bind_hint(kind: str, args: tuple, kwargs: tuple) -> dict:
    """Match a hint's arguments to its parameter names; raise HintError with a readable reason.

    ``args`` are positional values and ``kwargs`` ``(name, value)`` pairs; the values are
    passed through untouched (expression text for the compiler, objects for the runtime).
    """
    sig = HINT_SIGNATURES.get(kind)
    if sig is None:
        known = ", ".join(sorted(HINT_SIGNATURES))
        raise HintError(f"unknown generation hint `{kind}`; known hints: {known}")
    if len(args) > len(sig.positional):
        raise HintError(
            f"`{kind}` takes at most {len(sig.positional)} positional argument(s) "
            f"({', '.join(sig.positional) or 'none'}), got {len(args)}"
        )
    bound = dict(zip(sig.positional, args))
    for key, value in kwargs:
        if key not in sig.params():
            raise HintError(
                f"`{kind}` has no parameter `{key}`; its parameters are "
                f"{', '.join(sig.params()) or 'none'}"
            )
        if key in bound:
            raise HintError(f"`{kind}` got `{key}` twice")
        bound[key] = value
    missing = [p for p in sig.required if p not in bound]
    if missing:
        raise HintError(f"`{kind}` needs {', '.join(f'`{m}`' for m in missing)}")
    return bound


def parse_hint_text(text: str) -> tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]]:
    """``"indptr(over=kv_indices)"`` (a hint as `.fidef` spells it, without `gen`) as its
    kind, positional argument texts and (keyword, text) pairs; HintError when it is none."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise HintError(f"generation hint `{text}` is not valid: {exc.msg}") from None
    except (ValueError, MemoryError, RecursionError) as exc:
        raise HintError(f"generation hint `{text}` is not valid: {exc}") from None
    if isinstance(node, ast.Name):
        return (node.id, (), ())
    if (
        not isinstance(node, ast.Call)
        or not isinstance(node.func, ast.Name)
        or any(isinstance(a, ast.Starred) for a in node.args)
        or any(k.arg is None for k in node.keywords)
    ):
        raise HintError(f"generation hint `{text}` must look like `kind(args)`")
    try:
        args = tuple(ast.unparse(a) for a in node.args)
        kwargs = tuple((str(k.arg), ast.unparse(k.value)) for k in node.keywords)
    except RecursionError:
        raise HintError(f"generation hint `{text}` is nested too deeply") from None
    return (node.func.id, args, kwargs)


def check_hint(kind: str, args: tuple[str, ...], kwargs: tuple[tuple[str, str], ...]) -> dict:
    """``bind_hint`` over argument texts, each also held to the expression language (Note
    [checked expressions]) and, where it names an input, a bare name; HintError if not."""
    bound = bind_hint(kind, args, kwargs)
    sig = HINT_SIGNATURES[kind]
    for key, text in bound.items():
        try:
            check_expression(text, "a generation hint")
        except ExpressionError as exc:
            raise HintError(f"argument `{key}` of `{kind}`, `{text}`: {exc.message}") from None
        if key in sig.tensor_params and not text.strip().isidentifier():
            raise HintError(f"`{key}` of `{kind}` names an input, not `{text}`")
    return bound
