"""The one Jinja environment of every emitter, and how generated files name their source."""

from __future__ import annotations

import os
from functools import lru_cache

import jinja2

from fibgen.paths import templates_dir


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    # Templates loop and substitute; anything decided on the IR is computed in Python first.
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render(template: str, **context: object) -> str:
    """Render a template of templates/ with the given views."""
    return _environment().get_template(template).render(**context)


def source_label(path: str) -> str:
    """A source path as generated text shows it: never absolute, always '/'-separated."""
    if os.path.isabs(path):
        try:
            return os.path.relpath(path).replace(os.sep, "/")
        except ValueError:
            return os.path.basename(path)
    return path.replace(os.sep, "/")
