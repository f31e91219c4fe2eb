"""Sizes that cannot fit are refused before anything is allocated, in one line (issue 14,
item 18), and the other one-line refusals of that item's command lines."""

from __future__ import annotations

import pytest

from fibgen.cli import main
from fibgen.runtime.inputs import generator as input_generator
from fibgen.runtime.inputs import make as inputs
from fibgen.runtime.inputs.make import InputGenerationError, InputSpec, generate_inputs

from _bench_dataset import DEFINITION, make_dataset


def _fibgen(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_workloads_refuses_a_batch_that_cannot_fit(tmp_path, capsys):
    code, out, err = _fibgen(
        capsys,
        "workloads",
        "rmsnorm_h4096",
        "--axes",
        "batch_size=100000000",
        "-o",
        str(tmp_path / "ds"),
    )
    assert (code, out) == (1, "")
    assert err == (
        "error: rmsnorm_h4096 at batch_size=100000000: rmsnorm_h4096: input `hidden_states` "
        "of shape [100000000, 4096] (bfloat16) takes 762.9 GiB, more than this machine's free "
        "memory; give smaller var-axis values\n"
    )
    assert not (tmp_path / "ds").exists()


def test_the_inputs_made_before_count(monkeypatch):
    spec = InputSpec.from_definition_json(DEFINITION)
    monkeypatch.setattr(input_generator, "available_memory", lambda: 3 * 64 * 4 + 100)
    # x is [3, 64] float32 (768 bytes), w [64] (256 bytes): together past 868 bytes.
    with pytest.raises(InputGenerationError) as caught:
        generate_inputs(spec, {"n": 3})
    assert str(caught.value) == (
        "scale_h64: input `w` of shape [64] (float32) takes 256 B (with the inputs before it, "
        "1.0 KiB), more than this machine's free memory; give smaller var-axis values"
    )
    monkeypatch.setattr(input_generator, "available_memory", lambda: None)  # unknown: no limit
    assert generate_inputs(spec, {"n": 3})["x"].shape == (3, 64)


def test_available_memory_is_the_hosts_and_the_address_space_limit():
    import resource

    free = inputs.available_memory()
    assert free is not None and free > 0
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    assert limit == resource.RLIM_INFINITY or free <= limit


@pytest.mark.slow
def test_bench_refuses_a_workload_too_large_for_the_machine_in_one_line(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(10**12,))
    code, out, err = _fibgen(capsys, "bench", str(root), "--devices", "cpu", "--quiet")
    assert code == 1
    assert err == (
        "error: workload n1000000000000 of scale_h64: scale_h64: input `x` of shape "
        "[1000000000000, 64] (float32) takes 232.8 TiB, more than this machine's free memory; "
        "give smaller var-axis values\n"
    )
    assert out.splitlines()[-1] == "bench: FAILED: 1 error(s) above; 0 trace(s) written"


def test_bench_with_a_solutions_file_that_does_not_exist_is_one_line(tmp_path, capsys):
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,))
    code, out, err = _fibgen(
        capsys, "bench", str(root), "--devices", "cpu", "--solutions", "/nonexistent.json"
    )
    assert (code, out) == (1, "")
    assert err == (
        f"error: --solutions '/nonexistent.json' matches no solution of {root} and is no file "
        "or folder; the solutions are: good_returns\n"
    )
    assert not (root / "traces").exists()
