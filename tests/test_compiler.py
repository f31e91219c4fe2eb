"""The compiler: language constructs, instantiation, naming, and printing back."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fibgen.compiler import compile_sources, ir
from fibgen.compiler.formatter import format_text

ROOT = Path(__file__).resolve().parents[1]


def compile_text(text: str, path: str = "t.fidef"):
    return compile_sources([(path, path, textwrap.dedent(text))])


def definitions(text: str) -> dict[str, ir.Definition]:
    result = compile_text(text)
    assert result.module is not None, [d.message for d in result.diagnostics]
    return {d.name: d for d in result.module.definitions}


def test_family_with_instances_gives_one_definition_each():
    defs = definitions("""
        family rmsnorm {
          op_type rmsnorm
          tags [status:verified]
          axes {
            batch_size : var
            hidden_size : const h
          }
          inputs {
            x : bfloat16[batch_size, hidden_size]
          }
          instances {
            h=2048 tags [model:a]
            h=4096 "Four thousand."
          }
        }
        """)
    assert sorted(defs) == ["rmsnorm_h2048", "rmsnorm_h4096"]
    d = defs["rmsnorm_h2048"]
    assert d.tags == ("status:verified", "model:a")
    assert dict(d.consts) == {"hidden_size": 2048}
    assert defs["rmsnorm_h4096"].description == "Four thousand."
    assert [a.value for a in d.axes] == [None, 2048]


def test_name_parts_follow_params_then_consts_then_dtype():
    defs = definitions("""
        family moe {
          op_type moe
          dtype T in {bfloat16, float16}
          params { top_k topk }
          axes {
            n : var
            experts : const e
            hidden : const h
            blocks : const = hidden // 128
          }
          inputs {
            x : T[n, hidden]
            s : float32[blocks, n]
          }
          reference '''
            def run(x, s):
                return x
          '''
          instances {
            topk=8 e=256 h=7168
          }
        }
        """)
    assert sorted(defs) == [
        "moe_topk8_e256_h7168_bf16",
        "moe_topk8_e256_h7168_fp16",
    ]
    d = defs["moe_topk8_e256_h7168_fp16"]
    assert dict(d.consts)["blocks"] == 56
    assert d.inputs[0].dtype == "float16"
    assert d.reference.startswith("top_k = 8\n")


def test_name_template_and_pinned_const():
    defs = definitions("""
        family gdn_decode {
          op_type gdn
          name "gdn_decode_qk{num_q_heads}_v{num_v_heads}_k_last"
          axes {
            b : var
            seq_len : const = 1
            num_q_heads : const
            num_v_heads : const
          }
          inputs {
            q : bfloat16[b, seq_len, num_q_heads]
            v : bfloat16[b, seq_len, num_v_heads]
          }
          instances {
            num_q_heads=16 num_v_heads=32
          }
        }
        """)
    d = defs["gdn_decode_qk16_v32_k_last"]
    assert dict(d.consts) == {"seq_len": 1, "num_q_heads": 16, "num_v_heads": 32}


def test_scalars_zero_d_optional_sources_targets_and_hints():
    result = compile_text("""
        family decode {
          op_type gqa_paged
          api pkg.Wrapper.run(self, q, paged_kv_cache, *, out=None, lse=None)
          plan pkg.Wrapper.plan(self, indptr, indices, sm_scale=None)
          axes {
            b : var
            pages : var
            len_indptr : var
            nnz : var
            d : const d
          }
          constraints {
            len_indptr == b + 1; nnz == kv_indptr[-1].item()
          }
          inputs {
            q : bfloat16[b, d]
            k_cache : bfloat16[pages, d] <- paged_kv_cache[0]
            v_cache : bfloat16[pages, d] <- paged_kv_cache[1]
            kv_indptr : int32[len_indptr] <- plan.indptr gen indptr(over=kv_indices)
            kv_indices : int32[nnz] <- plan.indices gen indices(below=pages)
            sm_scale : float32 scalar <- plan.sm_scale gen value(1 / sqrt(d))
            bias : optional float32[] <- q
          }
          outputs {
            output : dtype(q)[b, d] -> out
            lse : float32[b] -> lse
          }
          instances { d=128 }
        }
        """)
    # `bias <- q` reads the same parameter as `q`: the only error here, and it is reported.
    assert result.module is None
    messages = [d.message for d in result.diagnostics]
    assert messages == ["`q` is read by both `q` and `bias`"]


def test_decode_family_compiles():
    defs = definitions("""
        family decode {
          op_type gqa_paged
          api pkg.Wrapper.run(self, q, paged_kv_cache, *, out=None, lse=None)
          plan pkg.Wrapper.plan(self, indptr, indices, sm_scale=None)
          axes {
            b : var
            pages : var
            nnz : var
            len_indptr : var
            d : const d
          }
          constraints {
            len_indptr == b + 1
          }
          inputs {
            q : bfloat16[b, d]
            k_cache : bfloat16[pages, d] <- paged_kv_cache[0]
            v_cache : bfloat16[pages, d] <- paged_kv_cache[1]
            kv_indptr : int32[len_indptr] <- plan.indptr gen indptr(over=kv_indices)
            kv_indices : int32[nnz] <- plan.indices gen indices(below=pages)
            sm_scale : float32 scalar <- plan.sm_scale gen value(1 / sqrt(d))
          }
          outputs {
            output : dtype(q)[b, d] -> out
            lse : float32[b] -> lse
          }
          instances { d=128 }
        }
        """)
    d = defs["decode_d128"]
    by_name = {t.name: t for t in d.inputs}
    assert by_name["sm_scale"].shape is None
    assert d.outputs[0].dtype == "bfloat16"
    assert d.constraints == ("len_indptr == b + 1",)


def test_zero_d_and_optional_tensors():
    defs = definitions("""
        family step {
          op_type x
          axes { n : var }
          inputs {
            x : float32[n]
            t : optional int32[] "A 0-D step counter."
          }
        }
        """)
    t = defs["step"].inputs[1]
    assert t.shape == () and t.optional and t.description == "A 0-D step counter."


def test_dispatch_group_is_kept_in_the_ir():
    result = compile_text("""
        family moe_a {
          op_type moe
          api pkg.moe(x, routing_method_type)
          axes { n : var }
          inputs { x : bfloat16[n] }
        }
        family moe_b {
          op_type moe
          api pkg.moe(x, routing_method_type)
          axes { n : var }
          inputs { x : bfloat16[n] }
        }
        dispatch pkg_moe on routing_method_type {
          1 -> moe_a
          2 -> moe_b
        }
        """)
    assert result.module is not None
    (group,) = result.module.dispatches()
    assert group.selector == "routing_method_type"
    assert [(c.value, c.family) for c in group.cases] == [(1, "moe_a"), (2, "moe_b")]


def test_every_error_of_a_file_is_reported_sorted():
    result = compile_text("""
        family a {
          op_type x
          axes { n : var }
          inputs { t : bf16[n, m] }
        }
        """)
    from fibgen.compiler.diagnostics import render_all

    assert len(result.diagnostics) == 2
    text = render_all(result.diagnostics, result.sources)
    assert text.index("unknown dtype `bf16`") < text.index("unknown axis `m`")
    assert text.endswith("2 errors emitted\n")


@pytest.mark.parametrize(
    "text",
    [
        "family f {\n  op_type x # trailing\n  # leading axes\n  axes {\n    n : var  # why\n  }\n"
        "  inputs { x : float32[n] }\n}\n",
        "# file comment\nfamily f { op_type x; axes { n : var }; inputs { x : float32[n] } }\n",
    ],
)
def test_fmt_keeps_comments_and_meaning_and_is_idempotent(text):
    once, diags = format_text(text, "t.fidef")
    assert once is not None, diags
    for comment in ("# trailing", "# leading axes", "# why", "# file comment"):
        assert (comment in text) == (comment in once)
    twice, _ = format_text(once, "t.fidef")
    assert twice == once


def test_reference_text_survives_fmt_exactly():
    ref = 'import torch\r\n\ndef run(x):\n    \n    return x  # "q"\n'
    from fibgen.compiler.printer import long_string

    text = (
        "family f {\n  op_type x\n  axes { n : var }\n  inputs { x : float32[n] }\n"
        f"  reference {long_string(ref, '  ')}\n}}\n"
    )

    def reference_of(source: str) -> str:
        module = compile_sources([("t.fidef", "t.fidef", source)]).module
        return module.definitions[0].reference

    assert reference_of(text) == ref
    once, _ = format_text(text, "t.fidef")
    assert reference_of(once) == ref


@pytest.mark.slow
def test_list_apis_names_the_api_of_every_definition_or_why_it_has_none(capsys):
    from fibgen.cli import main

    assert main(["list", "--by-definition", str(ROOT / "definitions")]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line for line in out[:-1]}
    assert "flashinfer.norm.rmsnorm (2 rules)" in rows["rmsnorm_h4096"]
    assert (
        "BatchDecodeWithPagedKVCacheWrapper.run + plan"
        in rows["gqa_paged_decode_h32_kv8_d128_ps64"]
    )
    assert (
        "none: FlashInfer's chunk_gated_delta_rule takes" in rows["gdn_prefill_qk4_v8_d128_k_last"]
    )
    # Every definition without an api says why.
    assert not [line for line in out if "no reason given" in line]
    assert out[-1].startswith(f"{len(rows)} definitions: ")


_STEP = """
    family step {
      op_type step
      api pkg.step(x, state, out=None)
      RETURNS
      axes { n : var }
      inputs {
        x : float32[n]
        state : float32[n]
      }
      outputs {
        output : float32[n] -> out
        new_state : float32[n] -> state
      }
    }
    """


def _family(returns: str) -> ir.Family:
    result = compile_text(_STEP.replace("RETURNS", returns))
    assert result.module is not None, [d.message for d in result.diagnostics]
    return result.module.families()[0]


def test_a_rule_over_a_let_is_named_by_the_parameters_the_let_reads():
    # Note [rule names] in fibgen/compiler/rules.py: the reason a caller sees names the
    # arguments it passed, not a name the definition made up.
    from fibgen.compiler import rules
    from fibgen.compiler.checks import EXPR_BUILTINS

    result = compile_text("""
        family scaled {
          op_type scaled
          api pkg.scaled(x, scale=None, bias=None, *, mode="a", out=None)
          axes { n : var }
          inputs { x : float32[n] }
          outputs { output : float32[n] -> out }
          rules {
            let has_bias = bias is not None
            let adjusted = scale is not None or has_bias
            let x = x.contiguous()
            adjusted
            mode == "a" or not has_bias
            mode in ("a", "b")
            x.is_contiguous()
            scale != 0
            let scale = scale if scale is not None else bias.abs()
            scale != 0
            1 > 0
          }
        }
        """)
    assert result.module is not None, [d.message for d in result.diagnostics]
    fam = result.module.families()[0]
    sc = rules.scope(fam, EXPR_BUILTINS)
    assert sc.let_reads == {"has_bias": ("bias",), "adjusted": ("scale", "bias")}
    named = [rules.rule_name(r, sc) for r in fam.rules if isinstance(r, ir.Require)]
    # Through a let over a let; a let in the place it is read; parameters alone as before;
    # a let named like its parameter is the parameter, whatever it reads; no parameter: the
    # text.
    assert named == ["scale,bias", "mode,bias", "mode", "x", "scale", "scale", "1 > 0"]
    # A let that raises is named by the value it could not compute.
    lets = [rules.rule_name(r, sc) for r in fam.rules if isinstance(r, ir.Let)]
    assert lets == ["has_bias", "adjusted", "x", "scale"]


def test_a_call_time_let_reads_the_parameters_of_a_plan_let_written_after_it():
    # Plan-time lets hold by the time any call-time rule runs, wherever they are written.
    from fibgen.compiler import rules
    from fibgen.compiler.checks import EXPR_BUILTINS

    result = compile_text("""
        family w {
          op_type w
          api pkg.W.run(self, q, *, out=None)
          plan pkg.W.plan(self, indptr, limit=None)
          axes { n : var }
          inputs { q : float32[n] }
          outputs { output : float32[n] -> out }
          rules {
            let wide = q.shape[-1] > plan.cap
            let plan.cap = plan.indptr.numel() if plan.limit is None else plan.limit
            not wide
          }
        }
        """)
    assert result.module is not None, [d.message for d in result.diagnostics]
    fam = result.module.families()[0]
    sc = rules.scope(fam, EXPR_BUILTINS)
    assert sc.let_reads["wide"] == ("q", "plan.indptr", "plan.limit")
    (rule,) = [r for r in fam.rules if isinstance(r, ir.Require)]
    assert rules.rule_name(rule, sc) == "q,plan.indptr,plan.limit"


def test_returns_lowers_its_outputs_in_order_with_their_positions():
    r = _family("returns new_state,  output").returns
    assert r.names == ("new_state", "output")
    # Line 5 of the dedented text: the statement, and each name where it is written.
    assert (r.span.line, r.span.column) == (5, 3)
    assert [(s.line, s.column) for s in r.name_spans] == [(5, 11), (5, 23)]
    with pytest.raises(Exception):
        r.names = ()  # frozen, like every IR node
    assert _family("returns none").returns.names == ()
    assert _family("").returns is None  # the default convention


def test_returns_is_dispatch_information_the_definition_json_leaves_out():
    from fibgen.codegen.definition_json import emit_definition_json

    def json_of(returns: str) -> list[tuple[str, str]]:
        module = compile_text(_STEP.replace("RETURNS", returns)).module
        return [(f.path, f.text) for f in emit_definition_json(module)]

    assert json_of("returns output, new_state") == json_of("") == json_of("returns none")


@pytest.mark.parametrize(
    "written, canonical",
    [
        ("returns   output ,new_state  # why", "  returns output, new_state  # why\n"),
        ("returns none", "  returns none\n"),
        ("returns output;", "  returns output\n"),
    ],
)
def test_fmt_prints_returns_after_the_api_line(written, canonical):
    text = textwrap.dedent(_STEP.replace("RETURNS", written))
    once, diags = format_text(text, "t.fidef")
    assert once is not None, diags
    lines = once.splitlines(keepends=True)
    api = next(i for i, line in enumerate(lines) if line.startswith("  api "))
    assert lines[api + 1] == canonical
    assert format_text(once, "t.fidef")[0] == once


@pytest.mark.parametrize(
    "value, spelled",
    [
        (1e-6, "1e-6"),
        (1e-5, "1e-5"),
        (2.5e-7, "2.5e-7"),
        (-1e-6, "-1e-6"),
        (1e16, "1e16"),
        (1.5e300, "1.5e300"),
        (0.01, "0.01"),
        (0.99, "0.99"),
        (1.0, "1.0"),
        (4096, "4096"),
        (-3, "-3"),
    ],
)
def test_numbers_print_in_their_shortest_spelling(value, spelled):
    from fibgen.compiler.printer import number

    assert number(value) == spelled
    assert type(value)(number(value)) == value


def test_fmt_writes_numbers_as_1e_6_not_1e_06():
    text = textwrap.dedent("""\
        family f {
          op_type x
          tolerance(atol=1e-6, rtol=2.5e-7, matched=0.99)

          params {
            EPS = 1e-6
            BIG = 1e16
          }

          axes {
            n : var
          }

          inputs {
            x : float32[n]
          }

          instances {
            EPS=1e-5
          }
        }
        """)
    once, diags = format_text(text, "t.fidef")
    assert once == text, diags
    (definition,) = definitions(text).values()
    assert dict(definition.param_values) == {"EPS": 1e-5, "BIG": 1e16}


def _family_named(name: str, template: str = "", instances: str = "") -> str:
    return (
        f"family {name} {{\n  op_type t\n{template}  params {{\n    mode m\n  }}\n"
        "  axes {\n    n : var\n  }\n  inputs {\n    x : float32[n]\n  }\n"
        f"  instances {{\n{instances or '    mode=a'}\n  }}\n}}\n"
    )


@pytest.mark.parametrize(
    "source, message",
    [
        (_family_named("class"), "family name `class` is a Python keyword"),
        (_family_named("_helper"), "family name `_helper` starts with '_'"),
        (_family_named("torch"), "family name `torch` is a name every generated"),
        (_family_named("APIS"), "family name `APIS` is a name every generated"),
        (
            _family_named("f", '  name "{mode}"\n', '    mode="lambda"'),
            "definition name `lambda` is a word that torch's op schema reserves",
        ),
        (
            _family_named("f", '  name "{mode}"\n', "    mode=NoneType"),
            "definition name `NoneType` is a word that torch's op schema reserves",
        ),
        (
            _family_named("f", "", '    mode="x.y"'),
            "definition name `f_mx.y` contains '.', which a torch op name cannot hold",
        ),
        (
            _family_named("f", "", '    mode="x-y"'),
            "definition name `f_mx-y` contains '-', which a torch op name cannot hold",
        ),
        (
            "family f {\n  op_type t\n  api pkg.f(x, sel)\n  axes { n : var }\n"
            "  inputs { x : float32[n] <- x }\n}\n"
            "dispatch def on sel {\n  1 -> f\n}\n",
            "dispatch group name `def` is a Python keyword",
        ),
    ],
)
def test_names_that_generated_code_cannot_carry_are_diagnostics(source, message):
    result = compile_text(source)
    assert not result.ok
    assert message in [d.message for d in result.diagnostics][0]


@pytest.mark.slow
def test_the_names_a_dispatcher_module_defines_are_reserved_for_families():
    # Note [generated names]: every name a generated module imports or the package defines.
    import ast

    from fibgen.compiler.checks.names import MODULE_NAMES

    defined = set()
    for path in (ROOT / "generated" / "python" / "fibgen_kernels").glob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.Assign):
                defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    public = {name for name in defined if not name.startswith("_")}
    assert public <= MODULE_NAMES, public - MODULE_NAMES


def test_a_definition_name_the_checks_let_by_registers_as_a_torch_op(tmp_path):
    import importlib
    import sys

    import torch

    from fibgen.cli import main

    # `match` and `type` are soft keywords of Python: names as any other, for torch too.
    source = (
        'family match {\n  op_type t\n  name "type_h{h}"\n'
        "  axes {\n    n : var\n    h : const h\n  }\n  inputs {\n    x : float32[n, h]\n  }\n"
        "  outputs {\n    y : float32[n, h]\n  }\n"
        '  reference """\n    def run(x):\n        return x * 2\n  """\n'
        "  instances {\n    h=4\n  }\n}\n"
    )
    (tmp_path / "m.fidef").write_text(source, encoding="utf-8")
    argv = ["build", str(tmp_path / "m.fidef"), "-o", str(tmp_path / "out")]
    assert main(argv + ["--package", "names_kernels"]) == 0
    sys.path.insert(0, str(tmp_path / "out" / "python"))
    try:
        module = importlib.import_module("names_kernels.match")
    finally:
        sys.path.remove(str(tmp_path / "out" / "python"))
    assert hasattr(torch.ops.names_kernels, "type_h4")
    assert hasattr(torch.ops.names_kernels, "match")
    assert torch.equal(module.match(torch.ones(2, 4)), torch.full((2, 4), 2.0))


def test_comments_stay_with_their_own_parse_across_threads():
    # The lexer's comment callback is shared by every parse; each parse_with_comments keeps
    # only its own comments, whatever runs beside it.
    import threading

    from fibgen.compiler.parser import parse_with_comments

    results: dict[int, list] = {}

    def run(i: int) -> None:
        text = f"# comment {i}\n" * 3
        for _ in range(20):
            _, _, comments = parse_with_comments(text, f"f{i}.fidef")
            results.setdefault(i, []).append(sorted({c[2] for c in comments}))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        assert results[i] == [[f"# comment {i}"]] * 20
