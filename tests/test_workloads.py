"""Workloads: the real dataset's files, materializing inputs, and `fibgen workloads`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from _shared import require_shared
from fibgen.cli import main
from fibgen.curation.synthetic import parse_grid, synthesize
from fibgen.curation.workloads import WorkloadError, input_spec, load_workloads, materialize
from fibgen.format import load_definitions, workload_problems
from fibgen.runtime.inputs.make import InputSpec

REPO = Path(__file__).resolve().parents[1]
DECODE = "gqa_paged_decode_h32_kv8_d128_ps1"


@pytest.fixture(scope="module")
def dataset() -> Path:
    return require_shared("flashinfer-trace")


def test_every_workload_file_of_the_real_dataset_loads(dataset):
    workloads = load_workloads(dataset)
    definitions = load_definitions(dataset)
    files = sorted((dataset / "workloads").glob("*/*.jsonl"))
    assert len(workloads) == len(files) == 26
    for path in files:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        assert len(workloads[path.stem]) == len(lines)
        one_file = load_workloads(path)
        assert one_file == {path.stem: workloads[path.stem]}
        for workload in workloads[path.stem]:
            assert workload_problems(definitions[path.stem], workload) == []


@pytest.mark.slow
def test_random_workloads_of_the_dataset_materialize(dataset):
    definitions = load_definitions(dataset)
    for name in ("rmsnorm_h128", "gemm_n128_k2048"):
        defn = definitions[name]
        spec = input_spec(defn)
        workload = load_workloads(dataset)[name][0]
        inputs = materialize(spec, workload, dataset)
        assert list(inputs) == list(defn.inputs)
        sizes = {**defn.const_axes, **workload.axes}
        for tensor_name, tensor in defn.inputs.items():
            assert tuple(inputs[tensor_name].shape) == tuple(sizes[d] for d in tensor.shape)


def test_a_missing_blob_is_reported_when_inputs_are_materialized(dataset):
    name = "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048"
    spec = input_spec(load_definitions(dataset)[name])
    workload = next(
        w
        for w in load_workloads(dataset)[name]
        if any(s.type == "safetensors" for s in w.inputs.values())
    )
    with pytest.raises(WorkloadError) as info:
        materialize(spec, workload, dataset)
    message = str(info.value)
    assert f"workload {workload.uuid} of {name}, input " in message
    assert "safetensors blob not found" in message


def test_a_workload_must_give_every_var_axis():
    spec = InputSpec(
        "d", (("n", "var", None), ("h", "const", 4)), (("x", "float32", ("n", "h"), False, None),)
    )
    from fibgen.format import RandomInput, Workload

    with pytest.raises(WorkloadError, match="no value for var axes n"):
        materialize(spec, Workload(uuid="u", axes={}, inputs={"x": RandomInput()}))
    with pytest.raises(WorkloadError, match="the workload has no entry"):
        materialize(spec, Workload(uuid="u", axes={"n": 2}, inputs={}))
    inputs = materialize(spec, Workload(uuid="u", axes={"n": 2}, inputs={"x": RandomInput()}))
    assert inputs["x"].shape == (2, 4)


def _run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["workloads", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_cli_writes_the_cross_product_with_index_blobs(tmp_path, capsys):
    code, out, err = _run(
        capsys,
        DECODE,
        "--axes",
        "batch_size=1,7",
        "--axes",
        "num_pages=64,128",
        "-o",
        str(tmp_path),
        "--definitions",
        str(REPO / "definitions"),
    )
    assert code == 0, err
    assert out.startswith(f"wrote 4 workload(s) of {DECODE} to ")
    (workloads,) = load_workloads(tmp_path).values()
    points = [(w.axes["batch_size"], w.axes["num_pages"]) for w in workloads]
    assert points == [(1, 64), (1, 128), (7, 64), (7, 128)]
    definitions = load_definitions(tmp_path)
    spec = input_spec(definitions[DECODE])
    for workload in workloads:
        assert workload.axes["len_indptr"] == workload.axes["batch_size"] + 1
        kinds = {n: s.type for n, s in workload.inputs.items()}
        assert kinds["q"] == "random" and kinds["kv_indptr"] == "safetensors"
        assert kinds["kv_indices"] == "safetensors" and kinds["sm_scale"] == "scalar"
        assert (tmp_path / workload.inputs["kv_indptr"].path).is_file()
        inputs = materialize(spec, workload, tmp_path)
        assert inputs["kv_indptr"][-1].item() == inputs["kv_indices"].shape[0]
        assert int(inputs["kv_indices"].max()) < workload.axes["num_pages"]

    # Running again adds nothing; --replace rewrites the file.
    code, out, _ = _run(
        capsys,
        DECODE,
        "--axes",
        "batch_size=1,7,9",
        "--axes",
        "num_pages=64,128",
        "-o",
        str(tmp_path),
        "--definitions",
        str(REPO / "definitions"),
    )
    assert code == 0 and "wrote 2 workload(s)" in out and "kept 4 existing" in out
    code, out, _ = _run(
        capsys, DECODE, "--axes", "batch_size=3", "--replace", "-o", str(tmp_path),
        "--definitions", str(REPO / "definitions"),
    )  # fmt: skip
    assert code == 0 and len(load_workloads(tmp_path)[DECODE]) == 1


def test_cli_reads_definitions_of_a_dataset(tmp_path, capsys, dataset):
    code, out, err = _run(
        capsys, "rmsnorm_h128", "--axes", "batch_size=2,4", "-o", str(tmp_path),
        "--definitions", str(dataset),
    )  # fmt: skip
    assert code == 0, err
    workloads = load_workloads(tmp_path)["rmsnorm_h128"]
    assert [w.axes for w in workloads] == [{"batch_size": 2}, {"batch_size": 4}]
    assert all(s.type == "random" for w in workloads for s in w.inputs.values())


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, code, message",
    [
        (["rmsnorm_h4069", "--axes", "batch_size=1"], 1, "did you mean `rmsnorm_h4096`"),
        (["rmsnorm_h4096", "--axes", "batch=1"], 1, "not a var axis: batch; its var axes"),
        (["rmsnorm_h4096", "--axes", "batch_size=x"], 2, "values must be integers"),
        (["rmsnorm_h4096", "--axes", "batch_size"], 2, "write AXIS=V1,V2,..."),
        (["rmsnorm_h4096", "--axes", "batch_size=1", "--axes", "batch_size=2"], 2, "twice"),
    ],
)
def test_cli_errors_say_what_to_change(tmp_path, capsys, args, code, message):
    got, _, err = _run(
        capsys, *args, "-o", str(tmp_path), "--definitions", str(REPO / "definitions")
    )
    assert got == code and message in err
    assert not (tmp_path / "workloads").exists()


def test_synthetic_uuids_are_stable():
    spec = InputSpec("d", (("n", "var", None),), (("x", "int32", ("n",), False, None),))
    first = synthesize(spec, "op", {"n": [1, 2]})
    again = synthesize(spec, "op", {"n": [1, 2]})
    assert [w.uuid for w, _ in first] == [w.uuid for w, _ in again]
    assert [w.uuid for w, _ in synthesize(spec, "op", {"n": [1, 2]}, seed=1)] != [
        w.uuid for w, _ in first
    ]
    assert parse_grid(["n=1, 2"]) == {"n": [1, 2]}


def test_traced_tensors_materialize_as_recorded(tmp_path):
    import fibgen.runtime as rt
    from fake_flashinfer.catalogue import generated_package

    generated_package()
    from fake_kernels import add_bias

    spec = InputSpec(
        "add_bias_h8",
        (("n", "var", None), ("hidden_size", "const", 8)),
        (
            ("x", "float32", ("n", "hidden_size"), False, None),
            ("bias", "float32", ("hidden_size",), False, None),
        ),
    )
    x, bias = torch.randn(3, 8), torch.randn(8)
    rt.enable_tracing(tmp_path, dump=["x"])
    try:
        add_bias.add_bias(x, bias)
    finally:
        rt.disable_tracing()
    (workload,) = load_workloads(tmp_path)["add_bias_h8"]
    inputs = materialize(spec, workload, tmp_path)
    assert torch.equal(inputs["x"], x) and inputs["bias"].shape == (8,)


def test_default_definitions_are_the_builtin_catalogue(tmp_path, capsys, monkeypatch):
    # A folder of one's own, nothing of the checkout in it: the catalogue comes with fibgen.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FIBGEN_DATASET_PATH", raising=False)
    code, out, err = _run(capsys, DECODE, "--axes", "batch_size=2", "--axes", "num_pages=8")
    assert code == 0, err
    assert out == f"wrote 1 workload(s) of {DECODE} to workloads/gqa_paged/{DECODE}.jsonl\n"
    # The dataset is complete: the definition and its sidecar sit beside the workloads.
    written = tmp_path / "definitions" / "gqa_paged" / f"{DECODE}.json"
    catalogue = REPO / "generated" / "definitions" / "gqa_paged"
    assert written.read_text() == (catalogue / f"{DECODE}.json").read_text()
    assert (
        written.with_suffix(".fibgen").read_text() == (catalogue / f"{DECODE}.fibgen").read_text()
    )
    code, _, err = _run(capsys, "rmsnorm_h4069", "--axes", "batch_size=1")
    assert code == 1 and "no definition named `rmsnorm_h4069` in fibgen's built-in catalogue" in err
    assert "did you mean `rmsnorm_h4096`" in err


@pytest.mark.slow
def test_a_fidef_source_writes_its_sidecar_too(tmp_path, capsys):
    code, _, err = _run(
        capsys, "top_k_sampling_from_probs_v128256", "--axes", "batch_size=2", "-o",
        str(tmp_path), "--definitions", str(REPO / "definitions"),
    )  # fmt: skip
    assert code == 0, err
    sidecar = tmp_path / "definitions" / "sampling" / "top_k_sampling_from_probs_v128256.fibgen"
    assert (
        sidecar.read_text()
        == (REPO / "generated" / "definitions" / "sampling" / sidecar.name).read_text()
    )


def test_a_sampling_definition_json_alone_makes_valid_probabilities(tmp_path, capsys):
    # A dataset with only flashinfer-bench's JSON (no sidecar): probs are made the way
    # flashinfer-bench makes them, rows that sum to one, and the reference samples from them.
    import json

    from fibgen.runtime.checking.testing import compile_reference

    name = "top_p_sampling_from_probs_v128256"
    source = REPO / "generated" / "definitions" / "sampling" / f"{name}.json"
    dataset = tmp_path / "ds"
    (dataset / "definitions" / "sampling").mkdir(parents=True)
    (dataset / "definitions" / "sampling" / source.name).write_text(source.read_text())
    code, _, err = _run(
        capsys, name, "--axes", "batch_size=3", "-o", str(dataset), "--definitions", str(dataset)
    )
    assert code == 0, err
    definition = json.loads(source.read_text())
    (workload,) = load_workloads(dataset)[name]
    inputs = materialize(input_spec(load_definitions(dataset)[name]), workload, dataset)
    assert torch.allclose(inputs["probs"].sum(-1), torch.ones(3)) and inputs["probs"].min() >= 0
    samples = compile_reference(definition)(**inputs)
    assert samples.shape == (3,)
