"""Tracing of hand-written calls on a GPU, inside a real CUDA-graph capture.

A scalar input given as a CUDA tensor is recorded as its value outside capture; inside it,
reading the value would synchronize, which capture forbids, so the call is counted
``capturing`` and the graph is captured as if tracing were off (Note [recorded hand-written
calls] in fibgen/runtime/tracing/handwritten.py).
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import fibgen.runtime as rt  # noqa: E402
from fibgen.format import load_workloads  # noqa: E402

NAME = "scale_rows_by_tensor_d8"
DEFINITION = {
    "name": NAME,
    "op_type": "own",
    "axes": {"n": {"type": "var"}, "d": {"type": "const", "value": 8}},
    "inputs": {
        "x": {"shape": ["n", "d"], "dtype": "float32"},
        "scale": {"shape": None, "dtype": "float32"},
    },
    "outputs": {"y": {"shape": ["n", "d"], "dtype": "float32"}},
    "reference": "def run(x, scale):\n    return x * scale\n",
}


def _scale(x, scale):
    return x * scale


def test_a_cuda_scalar_in_capture_is_counted_and_the_graph_still_captures(tmp_path):
    folder = tmp_path / "definitions" / "own"
    folder.mkdir(parents=True)
    (folder / f"{NAME}.json").write_text(json.dumps(DEFINITION), encoding="utf-8")
    x = torch.randn(4, 8, device="cuda")
    scale = torch.tensor(2.0, device="cuda")
    rt.enable_tracing(tmp_path, dump="none")
    try:
        rt.apply(NAME, (x, scale), fallback=_scale)  # eager: recorded, scale as its value
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
                out = rt.apply(NAME, (x, scale), fallback=_scale)
        torch.cuda.current_stream().wait_stream(stream)
        scale.fill_(3.0)
        graph.replay()
        torch.cuda.synchronize()
        stats = rt.tracing_stats()
    finally:
        rt.disable_tracing()
    torch.testing.assert_close(out, x * 3.0)
    assert (stats["recorded"], stats["capturing"], stats["failed"]) == (1, 1, 0), stats
    assert any("scalar input given as a CUDA tensor" in str(w.message) for w in said)
    (record,) = load_workloads(tmp_path)[NAME]
    assert record.axes == {"n": 4} and record.inputs["scale"].value == 2.0
