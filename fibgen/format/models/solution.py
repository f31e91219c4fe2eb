"""The Solution model: sources, and how to build and call them."""

from __future__ import annotations

import unicodedata
from typing import Optional

from pydantic import Field, field_validator, model_validator

from fibgen.format.models.base import (
    Binding,
    Language,
    Model,
    NonEmptyStr,
    check_name,
    raise_problems,
)


class SourceFile(Model):
    """One file of a solution, placed at ``path`` under the build directory."""

    path: NonEmptyStr
    content: NonEmptyStr

    @field_validator("path")
    @classmethod
    def _validate_path(cls, value: str) -> str:
        problem = source_path_problem(value)
        if problem:
            raise ValueError(problem)
        return value


def source_path_problem(path: str) -> str | None:
    """Why a source path is not a safe relative path, or None when it is."""
    # Check both spellings: a solution written on Windows must not escape the build dir either.
    parts = path.replace("\\", "/").split("/")
    if path.startswith(("/", "\\")) or (len(path) > 1 and path[1] == ":"):
        return f"source path {path!r} is absolute; use a path relative to the solution"
    if ".." in parts:
        return f"source path {path!r} contains '..'; a source may not leave the solution directory"
    # A NUL cannot be in a file name at all (the OS call fails), and other control characters
    # (newline, escape, DEL, C1) make names that terminals and logs show as something else.
    control = next((c for c in path if unicodedata.category(c) == "Cc"), None)
    if control is not None:
        return (
            f"source path {path!r} contains the control character {control!r}; a source path "
            "is printable text"
        )
    return None


class BuildSpec(Model):
    """How to build and call a solution."""

    language: Language
    target_hardware: list[str] = Field(min_length=1)
    entry_point: NonEmptyStr
    dependencies: list[NonEmptyStr] = Field(default_factory=list)
    destination_passing_style: bool = True
    binding: Optional[Binding] = None

    @field_validator("entry_point")
    @classmethod
    def _validate_entry_point(cls, value: str) -> str:
        count = value.count("::")
        if count != 1:
            raise ValueError(
                f"entry point {value!r} must have the form '<file>::<function>' with exactly "
                f"one '::' (found {count})"
            )
        file, symbol = value.split("::")
        if not file or not symbol:
            raise ValueError(
                f"entry point {value!r} must name both a file and a function: '<file>::<function>'"
            )
        return value

    @property
    def entry_file(self) -> str:
        """The file part of ``entry_point``."""
        return self.entry_point.split("::")[0]

    @property
    def entry_symbol(self) -> str:
        """The function part of ``entry_point``."""
        return self.entry_point.split("::")[1]


class Solution(Model):
    """A concrete implementation of one definition."""

    name: NonEmptyStr
    definition: NonEmptyStr
    author: NonEmptyStr
    description: Optional[str] = None
    spec: BuildSpec
    sources: list[SourceFile] = Field(min_length=1)

    @field_validator("name", "definition", "author")
    @classmethod
    def _validate_name(cls, value: str) -> str:
        return check_name(value)

    @model_validator(mode="after")
    def _validate_source_path_entry_point(self) -> Solution:
        problems = []
        seen: set[str] = set()
        for i, source in enumerate(self.sources):
            if source.path in seen:
                problems.append(f"sources[{i}].path: duplicate source path {source.path!r}")
            seen.add(source.path)
        entry_file = self.spec.entry_file
        if entry_file not in seen:
            listed = ", ".join(repr(s.path) for s in self.sources)
            problems.append(
                f"spec.entry_point: the entry file {entry_file!r} is not among the sources "
                f"({listed})"
            )
        raise_problems(problems)
        return self
