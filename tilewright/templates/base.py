"""What a kernel template is: a jinja2 source plus a :class:`TemplateSpec`.

A spec declares its tunable parameters as a typed :class:`ParamSpace`, says whether it can run a
problem on a target (:meth:`TemplateSpec.supports`), which parameter settings are legal there
(:meth:`TemplateSpec.check`), and renders source text (:meth:`TemplateSpec.render`). It never
chooses parameters: that is the autotuner's job. Logic lives in the spec's Python; the ``.jinja``
file holds the kernel text, rendered with ``StrictUndefined`` so a missing value is an error.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, Mapping

import jinja2

from tilewright.problem import GemmProblem
from tilewright.runtime.targets import Target

Params = Mapping[str, Any]


# -- parameter space -------------------------------------------------------------------------
@dataclass(frozen=True)
class Knob:
    """One tunable with a finite, ordered set of values (order defines neighbours)."""

    name: str
    values: tuple[Any, ...]
    default: Any
    doc: str = ""

    def __post_init__(self) -> None:
        if self.default not in self.values:
            raise ValueError(f"knob {self.name}: default {self.default!r} not in {self.values}")

    def neighbours(self, value: Any) -> list[Any]:
        i = self.values.index(value)
        return [self.values[j] for j in (i - 1, i + 1) if 0 <= j < len(self.values)]


def powers_of_two(lo: int, hi: int) -> tuple[int, ...]:
    out, v = [], lo
    while v <= hi:
        out.append(v)
        v *= 2
    return tuple(out)


@dataclass(frozen=True)
class ParamSpace:
    """A template's tunables. Params are plain dicts ``{knob name: value}``."""

    knobs: tuple[Knob, ...]

    def names(self) -> list[str]:
        return [k.name for k in self.knobs]

    def knob(self, name: str) -> Knob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise KeyError(name)

    def default(self) -> dict[str, Any]:
        return {k.name: k.default for k in self.knobs}

    def validate(self, params: Params) -> None:
        """Raise ValueError naming the first unknown, missing or out-of-range knob."""
        extra = set(params) - set(self.names())
        if extra:
            raise ValueError(f"unknown parameters {sorted(extra)}; this template takes {self.names()}")
        for k in self.knobs:
            if k.name not in params:
                raise ValueError(f"missing parameter {k.name}")
            if params[k.name] not in k.values:
                raise ValueError(f"{k.name}={params[k.name]!r} is not one of {k.values}")

    def encode(self, params: Params) -> str:
        """Stable text form, used in cache keys."""
        return json.dumps({k.name: params[k.name] for k in self.knobs}, separators=(",", ":"))

    def random(self, rng: random.Random) -> dict[str, Any]:
        return {k.name: rng.choice(k.values) for k in self.knobs}

    def neighbours(self, params: Params) -> list[dict[str, Any]]:
        """Settings that differ from ``params`` in one knob by one step."""
        out = []
        for k in self.knobs:
            for v in k.neighbours(params[k.name]):
                out.append({**params, k.name: v})
        return out


# -- rendering ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Support:
    """Whether a template can run a problem on a target; ``reason`` says why not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


SUPPORTED = Support(True)


@dataclass(frozen=True)
class RenderedKernel:
    """Source text a template produced, and how to load it.

    ``entry`` names the module-level launcher: ``launch(a, b, *epilogue_inputs, out=None)``
    returns the output tensor (written into ``out`` when given).
    """

    template_id: str
    params: Mapping[str, Any]
    target: str
    source: str
    name: str
    interpret: bool = False
    entry: str = "launch"
    language: str = "python"
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def source_hash(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]


def jinja_env(folder: Path) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


class TemplateSpec(ABC):
    """Base of every kernel template.

    Class attributes a subclass sets:
        id: unique "<backend>.<name>" ("triton.gemm").
        backend: the folder under templates/ it lives in ("triton", "aten", "cutedsl", ...).
        op: the problem kind it implements ("gemm").
        space: its :class:`ParamSpace`.
        jinja: file name of its source template beside the subclass's module (or None).
    """

    id: ClassVar[str]
    backend: ClassVar[str]
    op: ClassVar[str] = "gemm"
    space: ClassVar[ParamSpace] = ParamSpace(())
    jinja: ClassVar[str | None] = None

    @cached_property
    def folder(self) -> Path:
        return Path(inspect.getfile(type(self))).parent

    @cached_property
    def source_hash(self) -> str:
        """Hash of the template's jinja text and its spec module: changes when either does."""
        h = hashlib.sha256()
        h.update(Path(inspect.getfile(type(self))).read_bytes())
        if self.jinja:
            h.update((self.folder / self.jinja).read_bytes())
        return h.hexdigest()[:16]

    def render_jinja(self, **context: Any) -> str:
        assert self.jinja is not None
        return jinja_env(self.folder).get_template(self.jinja).render(**context)

    @abstractmethod
    def supports(self, problem: GemmProblem, target: Target) -> Support:
        """Can this template run ``problem`` on ``target`` at all (any parameters)?"""

    def check(self, params: Params, problem: GemmProblem, target: Target) -> str | None:
        """Why ``params`` are illegal for this problem on this target (None when legal)."""
        return None

    @abstractmethod
    def render(self, problem: GemmProblem, params: Params, target: Target) -> RenderedKernel:
        """Source text for ``problem`` with ``params`` on ``target``.

        Raises:
            UnsupportedProblemError: ``supports`` or ``check`` refuses.
        """

    def __repr__(self) -> str:
        return f"<template {self.id} {self.source_hash}>"
