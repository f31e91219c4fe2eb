"""The IR of families describing this package's APIs, and their generated dispatchers.

Built by hand, node by node, so the dispatch generator is tested on exactly the constructs it
must handle: a buffer output, in-place write-back, plan/run, a dispatch group with a name
template and a parameter, a dtype-generic family, and a family without an API.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from fibgen.compiler import ir

PACKAGE = "fake_kernels"
SOURCE = "tests/fake_flashinfer/fake.fidef"


def _dtype(name: str, kind: str = "concrete") -> ir.DtypeRef:
    return ir.DtypeRef(kind=kind, name=name)


def _tensor(name: str, dtype: str, shape, **extra) -> ir.Tensor:
    kind = "param" if dtype == "T" else "concrete"
    return ir.Tensor(name=name, dtype=_dtype(dtype, kind), shape=shape, **extra)


def _api(path: str, *params: str, keyword_only: tuple[str, ...] = ()) -> ir.ApiSignature:
    def param(text: str, kind: str) -> ir.ApiParam:
        name, _, default = text.partition("=")
        return ir.ApiParam(name=name, kind=kind, default=default or None)

    return ir.ApiSignature(
        path=path,
        params=tuple(param(p, "positional") for p in params)
        + tuple(param(p, "keyword_only") for p in keyword_only),
    )


def _const(name: str, abbrev: str | None = None, value: str | None = None) -> ir.ConstAxis:
    return ir.ConstAxis(name=name, abbrev=abbrev, value=ir.Expr(text=value) if value else None)


RMSNORM_REFERENCE = """\
import torch

EPS = 1e-6


def run(hidden_states, weight):
    x = hidden_states.float()
    return (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS) * weight).to(x.dtype)
"""

FUSED_REFERENCE = """\
import torch

EPS = 1e-6


def run(hidden_states, residual, weight):
    s = hidden_states + residual
    return s * torch.rsqrt(s.square().mean(-1, keepdim=True) + EPS) * weight, s
"""

ADD_BIAS_REFERENCE = """\
def run(x, bias):
    return x + bias
"""

rmsnorm = ir.Family(
    name="rmsnorm",
    op_type="rmsnorm",
    api=_api(
        "fake_flashinfer.norm.rmsnorm", "input", "weight", "eps=1e-6", "out=None", "enable_pdl=None"
    ),
    axes=(ir.VarAxis(name="batch_size"), _const("hidden_size", "h")),
    inputs=(
        _tensor(
            "hidden_states",
            "float32",
            ("batch_size", "hidden_size"),
            source=ir.Source(param="input"),
        ),
        _tensor("weight", "float32", ("hidden_size",)),
    ),
    outputs=(_tensor("output", "float32", ("batch_size", "hidden_size"), target="out"),),
    reference=RMSNORM_REFERENCE,
    instances=(
        ir.Instance(values=(ir.Assignment(key="h", value=2048),)),
        ir.Instance(values=(ir.Assignment(key="h", value=4096),)),
    ),
)

fused_add_rmsnorm = ir.Family(
    name="fused_add_rmsnorm",
    op_type="rmsnorm",
    api=_api(
        "fake_flashinfer.norm.fused_add_rmsnorm",
        "input",
        "residual",
        "weight",
        "eps=1e-6",
        "enable_pdl=None",
    ),
    axes=(ir.VarAxis(name="batch_size"), _const("hidden_size", "h")),
    inputs=(
        _tensor(
            "hidden_states",
            "float32",
            ("batch_size", "hidden_size"),
            source=ir.Source(param="input"),
        ),
        _tensor("residual", "float32", ("batch_size", "hidden_size")),
        _tensor("weight", "float32", ("hidden_size",)),
    ),
    outputs=(
        _tensor("output", "float32", ("batch_size", "hidden_size"), target="input"),
        _tensor("residual_out", "float32", ("batch_size", "hidden_size"), target="residual"),
    ),
    reference=FUSED_REFERENCE,
    instances=(ir.Instance(values=(ir.Assignment(key="h", value=4096),)),),
)

gqa_paged_decode = ir.Family(
    name="gqa_paged_decode",
    op_type="gqa_paged",
    api=_api(
        "fake_flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run",
        "self",
        "q",
        "paged_kv_cache",
        keyword_only=("out=None", "lse=None", "return_lse=False"),
    ),
    plan=_api(
        "fake_flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.plan",
        "self",
        "indptr",
        "indices",
        "last_page_len",
        "num_qo_heads",
        "num_kv_heads",
        "head_dim",
        "page_size",
        "sm_scale=None",
    ),
    axes=(
        ir.VarAxis(name="batch_size"),
        _const("num_qo_heads", "h"),
        _const("num_kv_heads", "kv"),
        _const("head_dim", "d"),
        ir.VarAxis(name="num_pages"),
        _const("page_size", "ps"),
        ir.VarAxis(name="len_indptr"),
        ir.VarAxis(name="num_kv_indices"),
    ),
    inputs=(
        _tensor("q", "bfloat16", ("batch_size", "num_qo_heads", "head_dim")),
        _tensor(
            "k_cache",
            "bfloat16",
            ("num_pages", "page_size", "num_kv_heads", "head_dim"),
            source=ir.Source(param="paged_kv_cache", index=0),
        ),
        _tensor(
            "v_cache",
            "bfloat16",
            ("num_pages", "page_size", "num_kv_heads", "head_dim"),
            source=ir.Source(param="paged_kv_cache", index=1),
        ),
        _tensor(
            "kv_indptr",
            "int32",
            ("len_indptr",),
            source=ir.Source(param="indptr", from_plan=True),
        ),
        _tensor(
            "kv_indices",
            "int32",
            ("num_kv_indices",),
            source=ir.Source(param="indices", from_plan=True),
        ),
        _tensor("sm_scale", "float32", None, source=ir.Source(param="sm_scale", from_plan=True)),
    ),
    outputs=(
        _tensor("output", "bfloat16", ("batch_size", "num_qo_heads", "head_dim"), target="out"),
        _tensor("lse", "float32", ("batch_size", "num_qo_heads"), target="lse"),
    ),
    instances=(
        ir.Instance(
            values=(
                ir.Assignment(key="h", value=4),
                ir.Assignment(key="kv", value=2),
                ir.Assignment(key="d", value=8),
                ir.Assignment(key="ps", value=1),
            )
        ),
    ),
)

_MOE_API = _api(
    "fake_flashinfer.fused_moe.moe",
    "hidden_states",
    "router_logits",
    "routing_method_type",
    "top_k=8",
    "out=None",
)


def _moe_family(name: str, template: str | None) -> ir.Family:
    return ir.Family(
        name=name,
        op_type="moe",
        name_template=template,
        api=_MOE_API,
        params=(ir.Param(name="top_k", abbrev="topk"),),
        axes=(
            ir.VarAxis(name="seq_len"),
            _const("num_experts", "e"),
            _const("hidden_size", "h"),
        ),
        inputs=(
            _tensor("hidden_states", "float32", ("seq_len", "hidden_size")),
            _tensor("router_logits", "float32", ("seq_len", "num_experts")),
        ),
        outputs=(_tensor("output", "float32", ("seq_len", "hidden_size"), target="out"),),
        instances=(
            ir.Instance(
                values=(
                    ir.Assignment(key="top_k", value=2),
                    ir.Assignment(key="e", value=8),
                    ir.Assignment(key="h", value=16),
                )
            ),
        ),
    )


moe_ds_routing = _moe_family("moe_ds_routing", "moe_ds_routing_topk{top_k}_e{num_experts}")
moe_renorm = _moe_family("moe_renorm", None)

moe_group = ir.DispatchGroup(
    name="moe",
    selector="routing_method_type",
    cases=(
        ir.DispatchCase(value=2, family="moe_ds_routing"),
        ir.DispatchCase(value=1, family="moe_renorm"),
    ),
)

relu = ir.Family(
    name="relu",
    op_type="activation",
    api=_api("fake_flashinfer.activation.relu", "input", "out=None"),
    dtype_params=(ir.DtypeParam(name="T", choices=("bfloat16", "float16")),),
    axes=(ir.VarAxis(name="num_tokens"), _const("hidden_size", "h")),
    inputs=(_tensor("x", "T", ("num_tokens", "hidden_size"), source=ir.Source(param="input")),),
    outputs=(_tensor("y", "T", ("num_tokens", "hidden_size"), target="out"),),
    instances=(
        ir.Instance(
            values=(ir.Assignment(key="T", value="bfloat16"), ir.Assignment(key="h", value=64))
        ),
        ir.Instance(
            values=(ir.Assignment(key="T", value="float16"), ir.Assignment(key="h", value=64))
        ),
    ),
)

add_bias = ir.Family(
    name="add_bias",
    op_type="elementwise",
    axes=(ir.VarAxis(name="n"), _const("hidden_size", "h"), _const("unused", None, "7")),
    inputs=(
        _tensor("x", "float32", ("n", "hidden_size")),
        _tensor("bias", "float32", ("hidden_size",)),
    ),
    outputs=(ir.Tensor(name="y", dtype=_dtype("x", "from"), shape=("n", "hidden_size")),),
    reference=ADD_BIAS_REFERENCE,
    # A tolerance of its own, so that its definition has a .fibgen sidecar to copy.
    tolerance=ir.Tolerance(atol=1e-3, rtol=1e-3),
    instances=(ir.Instance(values=(ir.Assignment(key="h", value=8),)),),
)

FAMILIES = (
    rmsnorm,
    fused_add_rmsnorm,
    gqa_paged_decode,
    moe_ds_routing,
    moe_renorm,
    relu,
    add_bias,
)


def _definition(family: ir.Family, name: str, index: int, **values) -> ir.Definition:
    consts = tuple((a.name, values[a.name]) for a in family.axes if a.name in values)
    return ir.Definition(
        name=name,
        op_type=family.op_type,
        description=None,
        tags=(),
        axes=(),
        constraints=(),
        inputs=(),
        outputs=(),
        reference=family.reference,
        family=family.name,
        source_file=SOURCE,
        instance_index=index,
        consts=consts,
        param_values=tuple((p.name, values[p.name]) for p in family.params if p.name in values),
        dtype_values=tuple(
            (d.name, values[d.name]) for d in family.dtype_params if d.name in values
        ),
    )


DEFINITIONS = (
    _definition(rmsnorm, "rmsnorm_h2048", 0, hidden_size=2048),
    _definition(rmsnorm, "rmsnorm_h4096", 1, hidden_size=4096),
    _definition(fused_add_rmsnorm, "fused_add_rmsnorm_h4096", 0, hidden_size=4096),
    _definition(
        gqa_paged_decode,
        "gqa_paged_decode_h4_kv2_d8_ps1",
        0,
        num_qo_heads=4,
        num_kv_heads=2,
        head_dim=8,
        page_size=1,
    ),
    _definition(
        moe_ds_routing, "moe_ds_routing_topk2_e8", 0, top_k=2, num_experts=8, hidden_size=16
    ),
    _definition(moe_renorm, "moe_renorm_e8_h16", 0, top_k=2, num_experts=8, hidden_size=16),
    _definition(relu, "relu_h64_bf16", 0, T="bfloat16", hidden_size=64),
    _definition(relu, "relu_h64_fp16", 1, T="float16", hidden_size=64),
    _definition(add_bias, "add_bias_h8", 0, hidden_size=8, unused=7),
)

MODULE = ir.Module(
    files=(ir.SourceFile(path=SOURCE, families=FAMILIES, dispatches=(moe_group,)),),
    definitions=DEFINITIONS,
)


@functools.lru_cache(maxsize=1)
def generated_package() -> ModuleType:
    """Emit the dispatchers of MODULE once per process into a temporary folder and import them.

    The definition JSON and sidecars go beside them, as `fibgen build` writes them.
    """
    from fibgen.codegen.python.bench_extras import emit_bench_extras
    from fibgen.codegen.definition_json import emit_definition_json
    from fibgen.codegen.python.dispatch.emit import emit_python_dispatch

    out = Path(tempfile.mkdtemp(prefix="fibgen-dispatch-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)  # imported until the process ends
    files = emit_python_dispatch(MODULE, PACKAGE)
    files += emit_definition_json(MODULE) + emit_bench_extras(MODULE)
    for f in files:
        path = out / f.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f.text, encoding="utf-8")
    sys.path.insert(0, str(out / "python"))
    return importlib.import_module(PACKAGE)
