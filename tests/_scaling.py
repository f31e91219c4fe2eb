"""Inputs whose size is one number, for the compiler's scaling test and benchmark.

Each builder returns a `.fidef` text that grows linearly with ``n``; what compiling it (and
rendering its diagnostics) costs should grow linearly too.
"""

from __future__ import annotations


def _family(block: str, instances: str = "", api: bool = False) -> str:
    return (
        "family f {\n  op_type f\n"
        + ("  api pkg.f(x, flag=None)\n" if api else "")
        + block
        + "  axes {\n    n : var\n  }\n  inputs {\n    x : float32[n]\n  }\n"
        + instances
        + "}\n"
    )


def constraint_over_lines(n: int) -> str:
    """One constraint written over ``n`` lines: brackets stay open until the last."""
    lines = "".join(f"      n + {i} > 0 and\n" for i in range(n))
    return _family(f"  constraints {{\n    n > 0 and (\n{lines}      n >= 0)\n  }}\n")


def rule_over_lines(n: int) -> str:
    """One rule of the `rules` block written over ``n`` lines."""
    lines = "".join(f"      flag != {i} and\n" for i in range(n))
    return _family(f"  rules {{\n    flag is None or (\n{lines}      flag >= 0)\n  }}\n", api=True)


def errors_on_one_line(n: int) -> str:
    """An instance line of ``n`` unknown keys: ``n`` errors quote the one long line."""
    keys = " ".join(f"k{i}=1" for i in range(n))
    return _family("", f"  instances {{\n    {keys}\n  }}\n")


def one_error_on_a_long_line(n: int) -> str:
    """A line of about ``n`` characters (a description) with one syntax error at its end."""
    return _family("").replace("x : float32[n]", f"x : float32[n] \"{'a' * n}\" @")
