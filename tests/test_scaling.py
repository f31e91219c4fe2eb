"""What the compiler does grows linearly with its input: counted, not timed.

Two inputs once cost the square of their size: a constraint or rule continued over many
lines (the open brackets were counted over the whole statement again at each line: 10,000
lines took 83 s) and many diagnostics on one long line (the line was prepared for display
once per diagnostic: a 120 KB line took 19 s). Each case here runs at size N and 2N and the
work is compared in a deterministic unit: Python function calls as cProfile counts them (a
generator's every step is one), and characters prepared for display. Linear work doubles; the
bound is 2.6; the quadratic work it replaced quadrupled.
"""

from __future__ import annotations

import cProfile
import pstats

import pytest

from _scaling import constraint_over_lines, errors_on_one_line, rule_over_lines
from fibgen.compiler import compile_sources, diagnostics
from fibgen.compiler.diagnostics import render_all

RATIO = 2.6


def _compile(text: str):
    return compile_sources([("f.fidef", "f.fidef", text)])


def _calls(text: str) -> int:
    """Python function calls made compiling ``text`` and rendering its diagnostics."""
    profiler = cProfile.Profile()
    profiler.enable()
    result = _compile(text)
    render_all(result.diagnostics, result.sources)
    profiler.disable()
    return pstats.Stats(profiler).total_calls


@pytest.mark.slow
@pytest.mark.parametrize(
    "build, n, ok",
    [
        (constraint_over_lines, 400, True),
        (rule_over_lines, 400, True),
        (errors_on_one_line, 500, False),
    ],
)
def test_compiling_costs_calls_linear_in_the_input(build, n, ok):
    _calls(build(8))  # the grammar, the regexes and the checker's tables are made once
    small, large = _calls(build(n)), _calls(build(2 * n))
    assert _compile(build(n)).ok is ok
    assert large / small < RATIO, (small, large)


def test_a_statement_over_many_lines_is_one_statement():
    result = _compile(constraint_over_lines(50))
    assert result.ok, result.diagnostics
    (definition,) = result.module.definitions
    (constraint,) = definition.constraints
    assert constraint.count("\n") == 51 and constraint.endswith("n >= 0)")


def test_a_long_line_is_prepared_for_display_once(monkeypatch):
    prepared = []
    visible = diagnostics._visible

    def counting(line: str) -> str:
        prepared.append(len(line))
        return visible(line)

    monkeypatch.setattr(diagnostics, "_visible", counting)

    def characters(n: int) -> int:
        prepared.clear()
        result = _compile(errors_on_one_line(n))
        text = render_all(result.diagnostics, result.sources)
        assert text.count("error: ") == n
        return sum(prepared)

    small, large = characters(500), characters(1000)
    assert large / small < RATIO, (small, large)
    assert small < 2 * len(errors_on_one_line(500))
