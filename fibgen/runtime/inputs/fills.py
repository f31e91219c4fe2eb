"""Making one input as its generation hint says: plain and random fills, indptr, last page
lengths, indices, and the packed formats.

Note [fp8 from bits]: random float8 fills are built from random bytes, not by rounding
``randn``: drawing a normal per element made the multi-GiB MoE weights take 13-17 s, bytes
take an eighth of that. Each byte keeps a random sign and the low exponent and mantissa bits;
the high exponent bits are fixed so that every value is a normal number of magnitude in
[1/8, 2): never NaN, Inf, zero or subnormal, with a spread close to a unit normal's.

Note [16-bit normals]: a random float16 or bfloat16 fill is drawn in its own dtype, not drawn
in float32 and rounded. torch draws the same float32 normals either way and rounds each (the
values are equal bit for bit whenever the element count is a multiple of 16, and from the same
distribution otherwise), but skips the float32 tensor: half the time and a third of the
memory traffic for the large weights of a GEMM or an MoE at model shapes.

Note [large random fills]: an elementwise random fill of more than ``TILE_ABOVE`` elements
draws ``TILE_PERIOD`` values (a prime, about a million) and repeats them to the end, a copy at
memory speed instead of a draw per element: the bfloat16 weights of a GEMM of 57344 x 8192
took 2.6 s to draw and take 0.2 s (one thread: 0.4 s) this way, and such draws were most of
the time the generated tests spent making inputs. The values keep their distribution, and
because the period is a prime larger than any row, two elements share a value only when their
flat offsets differ by a multiple of it: no two rows, columns, experts or pages of a tensor of
fewer than a million rows repeat each other, so a kernel that reads the wrong one still reads
other values. Fills that are not elementwise (indptr, indices, probabilities, the packed
formats) draw every element.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from fibgen.format.models import DTYPE_BYTES
from fibgen.runtime.inputs.sizes import format_bytes
from fibgen.runtime.inputs.specs import (
    INT_DTYPES,
    Hint,
    InputGenerationError,
    InputSpec,
    bare_name,
    torch_dtype,
)

# Small enough for a CPU reference on any definition, large enough to exercise batching.
# Segment lengths of an indptr when the total is free: "a few tokens per sequence".
DEFAULT_MIN_LEN = 1
DEFAULT_MAX_LEN = 8

# Note [fp8 from bits]: (bits kept from a random byte, bits set) per float8 format. e4m3fn:
# s.eeee.mmm with the exponent forced to 0b01xx (2^-3..2^0); e5m2: s.eeeee.mm with the
# exponent forced to 0b011xx (2^-3..2^0).
_FP8_BITS = {"float8_e4m3fn": (0x9F, 0x20), "float8_e5m2": (0x8F, 0x30)}
# Note [large random fills]: a prime period, and the size above which it repeats.
TILE_PERIOD = 1_048_573
TILE_ABOVE = 4 * TILE_PERIOD
# Note [16-bit normals]
_DRAWN_IN_DTYPE = frozenset({"float16", "bfloat16"})


class Fills:
    """How a ``_Generator`` (a subclass) makes each input from its hint; making one may
    decide the axes its hint provides."""

    # Set by the subclass's __init__.
    spec: InputSpec
    rng: torch.Generator
    kinds: dict[str, str]
    axes: dict[str, int]
    inputs: dict[str, tuple[str, str, tuple[str, ...] | None, bool, Hint | None]]
    values: dict[str, Any]
    bound: dict[str, dict]
    axis_scalars: set[str]
    nbytes: int
    memory: int | None

    if TYPE_CHECKING:
        # Defined by the subclass.
        def _eval(self, text: str, where: str, env: dict[str, Any] | None = None) -> Any: ...
        def _default_axis(self, axis: str) -> int: ...
        def _first_axis(self, tensor: str) -> str: ...

    def _arg(self, name: str, key: str, default: Any = None) -> Any:
        text = self.bound[name].get(key)
        if text is None:
            return default
        return self._eval(text, f"hint argument `{key}` of `{name}`")

    def _tensor_arg(self, name: str, key: str) -> torch.Tensor | None:
        text = self.bound[name].get(key)
        return None if text is None else self.values[bare_name(text) or text]

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
            if name in self.axis_scalars:
                return self.axes[name]  # the value of the var axis of its name
            return self._make_scalar(name, dtype, kind)
        if all(d in self.axes for d in shape_names):
            self._reserve(name, dtype, tuple(self.axes[d] for d in shape_names))
        if kind == "indptr":
            return self._make_indptr(name, dtype, shape_names)
        if kind == "last_page_len":
            return self._make_last_page_len(name, dtype, shape_names)
        if kind == "indices":
            return self._make_indices(name, dtype, shape_names)
        if kind == "bsr_indices":
            return self._make_bsr_indices(name, dtype, shape_names)
        shape = tuple(self.axes[d] for d in shape_names)
        if kind == "sparse_indices":
            return self._make_sparse_indices(name, dtype, shape)
        if kind == "fp8_paged_with_scales":
            return self._make_fp8_paged(name, dtype, shape)
        if kind == "mxfp4_paged_with_scales":
            return self._make_mxfp4_paged(name, dtype, shape)
        if kind == "ue8m0_packed":
            return self._make_ue8m0(name, dtype, shape)
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
        cast = bool if dtype == "bool" else int if dtype in INT_DTYPES else float
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

    def _drawn(self, shape: tuple, draw: Callable[[int], torch.Tensor]) -> torch.Tensor:
        """``draw(n)`` (n values drawn independently, 1-D) in ``shape``; a large fill repeats
        one drawn period (Note [large random fills])."""
        n = math.prod(shape)
        if n <= TILE_ABOVE:
            return draw(n).reshape(shape)
        period = draw(TILE_PERIOD)
        out = torch.empty(n, dtype=period.dtype)
        whole = n // TILE_PERIOD
        out[: whole * TILE_PERIOD].view(whole, TILE_PERIOD).copy_(period.expand(whole, -1))
        out[whole * TILE_PERIOD :].copy_(period[: n - whole * TILE_PERIOD])
        return out.view(shape)

    def _random_bytes(self, n: int) -> torch.Tensor:
        # 64-bit draws give eight bytes each: far cheaper than a draw per byte.
        words = torch.randint(
            -(2**63), 2**63 - 1, (-(-n // 8),), dtype=torch.int64, generator=self.rng
        )
        return words.view(torch.uint8)[:n]

    def _fp8_bits(self, n: int, dtype: str) -> torch.Tensor:
        keep, fixed = _FP8_BITS[dtype]  # Note [fp8 from bits]
        raw = self._random_bytes(n)
        raw &= keep
        raw |= fixed
        return raw

    def _make_plain(self, name: str, dtype: str, shape: tuple, kind: str | None) -> torch.Tensor:
        rng = self.rng
        tdtype = torch_dtype(dtype)
        if dtype == "float4_e2m1" and kind == "zeros":
            return torch.zeros(shape, dtype=torch.uint8).view(tdtype)
        if dtype == "float4_e2m1" and kind is None:
            # Note [fp4]: any byte is two valid e2m1 values.
            return self._drawn(shape, self._random_bytes).view(tdtype)
        if dtype in _FP8_BITS and kind is None:
            return self._drawn(shape, lambda n: self._fp8_bits(n, dtype)).view(tdtype)
        if kind is None:
            if dtype == "bool":
                return self._drawn(shape, lambda n: torch.randint(0, 2, (n,), generator=rng).bool())
            if dtype in INT_DTYPES:
                return self._drawn(
                    shape, lambda n: torch.randint(0, 4, (n,), generator=rng).to(tdtype)
                )
            if dtype in _DRAWN_IN_DTYPE:  # Note [16-bit normals]
                return self._drawn(shape, lambda n: torch.randn(n, generator=rng, dtype=tdtype))
            return self._drawn(shape, lambda n: self._finish(torch.randn(n, generator=rng), dtype))
        if kind == "zeros":
            return torch.zeros(shape, dtype=tdtype)
        if kind == "ones":
            return self._finish(torch.ones(shape), dtype)
        if kind == "value":
            return self._finish(torch.full(shape, self._arg(name, "value")), dtype)
        if kind == "normal":
            mean, std = self._arg(name, "mean", 0.0), self._arg(name, "std", 1.0)
            return self._drawn(
                shape,
                lambda n: self._finish(torch.randn(n, generator=rng) * std + mean, dtype),
            )
        if kind == "range":
            lo, hi = self._arg(name, "lo"), self._arg(name, "hi")
            if dtype in INT_DTYPES:
                if int(hi) <= int(lo):
                    raise InputGenerationError(
                        f"{self.spec.name}: range({lo}, {hi}) for `{name}` is empty"
                    )
                return self._drawn(
                    shape,
                    lambda n: torch.randint(int(lo), int(hi), (n,), generator=rng).to(tdtype),
                )
            return self._drawn(
                shape,
                lambda n: self._finish(lo + (hi - lo) * torch.rand(n, generator=rng), dtype),
            )
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
        if not shape_names:
            raise InputGenerationError(f"{self.spec.name}: indptr `{name}` must be 1-D or more")
        length = self.axes[shape_names[-1]]
        if length < 1:
            raise InputGenerationError(f"{self.spec.name}: indptr `{name}` needs length >= 1")
        # An N-D indptr (BSR rows per batch and head) chains its rows: each row's segments
        # follow the previous row's, its offsets absolute into the one tensor they index.
        rows = math.prod(self.axes[d] for d in shape_names[:-1])
        n = (length - 1) * rows
        if len(shape_names) > 1 and self.bound[name].get("at_least") is not None:
            raise InputGenerationError(
                f"{self.spec.name}: indptr `{name}` of rank {len(shape_names)} takes no at_least"
            )
        over = bare_name(self.bound[name]["over"]) or self.bound[name]["over"]
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
        if len(shape_names) == 1:
            return torch.tensor(offsets, dtype=torch_dtype(dtype))
        per_row = length - 1
        chained = [offsets[r * per_row : (r + 1) * per_row + 1] for r in range(rows)]
        shape = tuple(self.axes[d] for d in shape_names)
        return torch.tensor(chained, dtype=torch_dtype(dtype)).reshape(shape)

    def _make_last_page_len(self, name: str, dtype: str, shape_names: tuple) -> torch.Tensor:
        indptr = self._tensor_arg(name, "indptr")
        assert indptr is not None  # a required argument of the hint
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
        bare = bare_name(self.bound[name]["below"])
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

    def _make_bsr_indices(self, name: str, dtype: str, shape_names: tuple) -> torch.Tensor:
        """The column blocks of a BSR matrix: each segment of ``indptr`` (every row of an N-D
        one, its offsets absolute into this tensor) gets distinct, ascending integers in
        [0, below); entries no segment covers stay 0."""
        indptr = self._tensor_arg(name, "indptr")
        assert indptr is not None  # a required argument of the hint
        if len(shape_names) != 1:
            raise InputGenerationError(f"{self.spec.name}: bsr_indices `{name}` must be 1-D")
        below = int(self._arg(name, "below"))
        offsets = indptr.reshape(-1, indptr.shape[-1]).long()
        total = self.axes[shape_names[0]]
        out = torch.zeros(total, dtype=torch.int64)
        for row in offsets.tolist():
            for start, end in zip(row[:-1], row[1:]):
                if end - start > below or not 0 <= start <= end <= total:
                    raise InputGenerationError(
                        f"{self.spec.name}: `{name}` cannot hold the segment {start}..{end} of "
                        f"distinct blocks below {below} in {total} entries"
                    )
                chosen = torch.randperm(below, generator=self.rng)[: end - start]
                out[start:end] = chosen.sort().values
        return out.to(torch_dtype(dtype))

    def _make_sparse_indices(self, name: str, dtype: str, shape: tuple) -> torch.Tensor:
        below = int(self._arg(name, "below"))
        min_valid = int(self._arg(name, "min_valid", 1))
        ascending = bool(self._arg(name, "ascending", False))
        k = shape[-1]
        rows = math.prod(shape[:-1])
        cap = min(k, below)
        out = torch.full((rows, k), -1, dtype=torch.int64)
        for r in range(rows):
            count = int(torch.randint(min(min_valid, cap), cap + 1, (), generator=self.rng))
            chosen = torch.randperm(below, generator=self.rng)[:count]
            out[r, :count] = chosen.sort().values if ascending else chosen
        return out.reshape(shape).to(torch_dtype(dtype))

    def _paged_with_scales(self, hint: str, row: str, name: str, dtype: str, shape: tuple) -> tuple:
        """(pages, page_size, heads, width) of a paged cache whose pages end in four bytes of
        scale per token and head, or a message naming the hint and the layout it wants."""
        if len(shape) != 4 or shape[-1] <= 4 or dtype != "int8":
            raise InputGenerationError(
                f"{self.spec.name}: {hint} wants an int8 tensor "
                f"[pages, page_size, heads, {row} + 4], got {dtype}{list(shape)} for `{name}`"
            )
        return shape

    @staticmethod
    def _pages(
        values: torch.Tensor, scales: torch.Tensor, shape: tuple, dtype: str
    ) -> torch.Tensor:
        """Each page's value bytes, then its scale bytes, viewed as the cache."""
        raw = torch.cat([values, scales], dim=1).reshape(shape)
        return raw.view(torch_dtype(dtype))

    def _make_fp8_paged(self, name: str, dtype: str, shape: tuple) -> torch.Tensor:
        args = ("fp8_paged_with_scales", "dim", name, dtype, shape)
        pages, page_size, heads, width = self._paged_with_scales(*args)
        values = torch.randn((pages, page_size * heads * (width - 4)), generator=self.rng)
        fp8 = values.to(torch.float8_e4m3fn).view(torch.uint8)
        scales = 0.01 + 0.09 * torch.rand((pages, page_size * heads), generator=self.rng)
        return self._pages(fp8, scales.to(torch.float32).view(torch.uint8), shape, dtype)

    def _ue8m0_bytes(self, n: int) -> torch.Tensor:
        # Exponent bytes 120..130: scales 2**-7 .. 2**3, far from 0 (a zero scale) and 255.
        return torch.randint(120, 131, (n,), generator=self.rng, dtype=torch.int32).to(torch.uint8)

    def _make_ue8m0(self, name: str, dtype: str, shape: tuple) -> torch.Tensor:
        if dtype != "int32":
            raise InputGenerationError(
                f"{self.spec.name}: ue8m0_packed wants an int32 tensor, got {dtype} for `{name}`"
            )
        return self._ue8m0_bytes(4 * math.prod(shape)).view(torch.int32).reshape(shape)

    def _make_mxfp4_paged(self, name: str, dtype: str, shape: tuple) -> torch.Tensor:
        args = ("mxfp4_paged_with_scales", "dim / 2", name, dtype, shape)
        pages, page_size, heads, width = self._paged_with_scales(*args)
        # Every byte is two valid E2M1 codes (e2m1 has no NaN or Inf).
        codes = torch.randint(0, 256, (pages, page_size * heads * (width - 4)), generator=self.rng)
        scales = self._ue8m0_bytes(pages * page_size * heads * 4).reshape(pages, -1)
        return self._pages(codes.to(torch.uint8), scales, shape, dtype)

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
