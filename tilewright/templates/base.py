"""What a kernel template is: a jinja2 source plus a :class:`TemplateSpec`.

A spec declares its tunable parameters as a typed :class:`ParamSpace`, says whether it can run a
problem on a target (:meth:`TemplateSpec.supports`), which parameter settings are legal there
(:meth:`TemplateSpec.check`), and renders source text (:meth:`TemplateSpec.render`). It never
chooses parameters: that is the autotuner's job. Logic lives in the spec's Python; the ``.jinja``
file holds the kernel text, rendered with ``StrictUndefined`` so a missing value is an error.
"""

from __future__ import annotations

import functools
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

from tilewright.errors import UnsupportedProblemError
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.runtime.aot import AotSpec
from tilewright.runtime.languages import Language, get_language
from tilewright.runtime.targets import Target
from tilewright.runtime.verify import InstructionCheck

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

    def complete(self, params: Params) -> dict[str, Any]:
        """``params`` with the default of every knob it leaves out."""
        return {**self.default(), **params}

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

_raised_warned: set[tuple[str, str]] = set()


def _support_raised(template: Any, e: Exception) -> Support:
    """The refusal of a template whose ``supports()`` raised: a bug in it (often someone else's
    template) costs that template, not the kernel; warned once per template and error."""
    import warnings

    tid = getattr(template, "id", type(template).__name__)
    text = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else '-'}"
    if (tid, text) not in _raised_warned:
        _raised_warned.add((tid, text))
        warnings.warn(f"tilewright: template {tid!r} raised in supports() ({text}); it is left out of "
                      "the candidates of every problem it raises on (fix its problem_support)",
                      RuntimeWarning, stacklevel=3)
    return Support(False, f"supports() raised {text}")


def _guarded_supports(fn: Any) -> Any:
    """``fn`` (a ``supports``) returning a refusal where it raises (:func:`_support_raised`)."""
    @functools.wraps(fn)
    def supports(self: Any, problem: Any, target: Target) -> Support:
        try:
            return fn(self, problem, target)
        except Exception as e:  # noqa: BLE001 - a broken template refuses, the kernel goes on
            return _support_raised(self, e)
    supports._tw_guarded = True  # type: ignore[attr-defined]
    return supports


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
    aot: AotSpec | None = None

    @property
    def source_hash(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]


TEMPLATES_ROOT = Path(__file__).parent


@functools.lru_cache(maxsize=None)
def jinja_env(folder: Path) -> jinja2.Environment:
    """Templates load from their own folder, and shared macros from ``templates/common/``. One
    environment per folder and process, so each jinja file is compiled once, not at every render
    (the loader still sees an edited file: it checks the file's time at each lookup)."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(folder), str(TEMPLATES_ROOT)]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


# the packages whose code shapes rendered kernel text (an import of anything else, say the
# autotuner, does not change what a template renders). Every kind's folder is under
# tilewright.kinds; a template counts the modules of it that it imports (its problem, its views),
# never the kind's policy or lowering, which no template imports.
_RENDER_PACKAGES = ("tilewright.templates", "tilewright.ir", "tilewright.kinds")


def _imported_render_modules(start: set[Path]) -> set[Path]:
    """The files of the template and IR modules that ``start`` imports, transitively (imports
    inside functions included: templates import lazily)."""
    seen: set[Path] = set()
    todo = list(start)
    while todo:
        for origin in _render_imports_of(todo.pop()):
            if origin not in seen and origin not in start:
                seen.add(origin)
                todo.append(origin)
    return seen


def _render_imports_of(path: Path) -> tuple[Path, ...]:
    """The files of the template and IR modules that ``path`` imports itself. Parsed once per
    process and version of the file (every template's closure walks the same shared modules:
    parsing them per template was most of a first call's template hashing)."""
    st = path.stat()
    return _render_imports_cached(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=None)
def _render_imports_cached(path: Path, mtime_ns: int, size: int) -> tuple[Path, ...]:
    import ast

    found: dict[Path, None] = {}
    # imports are statements: only statement bodies are walked, never the expressions in them
    # (most of a module's nodes; walking them all was most of the time)
    todo = list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        for block in ("body", "orelse", "finalbody", "handlers", "cases"):
            todo.extend(getattr(node, block, None) or ())
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] + [f"{node.module}.{a.name}" for a in node.names] \
            if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
        for name in names:
            origin = _module_file(name) if name.startswith(_RENDER_PACKAGES) else None
            if origin is not None:
                found[origin] = None
    return tuple(found)


@functools.lru_cache(maxsize=None)
def _module_file(name: str) -> Path | None:
    """The ``.py`` file of module ``name``, or None (not a module: an attribute imported from
    one; or not Python source)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec and spec.origin and spec.origin.endswith(".py") else None


def _jinja_closure(folder: Path, name: str) -> set[Path]:
    """The jinja file and every file it includes, imports or extends, transitively."""
    from jinja2 import meta

    env = jinja_env(folder)
    found: set[Path] = set()
    todo = [name]
    while todo:
        source, filename, _ = env.loader.get_source(env, todo.pop())
        if Path(filename) in found:
            continue
        found.add(Path(filename))
        todo += [r for r in meta.find_referenced_templates(env.parse(source)) if r]
    return found


class TemplateSpec(ABC):
    """Base of every kernel template.

    Class attributes a subclass sets:
        id: unique "<language>.<name>" ("triton.gemm").
        backend: the language it is written in, which is also its folder under templates/
            ("triton", "aten", "cutedsl", ...); a registered
            :class:`~tilewright.runtime.languages.Language`.
        op: the problem kind it implements ("gemm", "pointwise", "reduction", "grouped_gemm").
        space: its :class:`ParamSpace`.
        jinja: file name of its source template beside the subclass's module (or None).

    Methods a subclass implements: :meth:`problem_support` (can it run a problem on a target)
    and :meth:`render_kernel` (the source, for parameters already checked). The base class
    owns :meth:`supports` (the language's availability, then ``problem_support``) and
    :meth:`render` (complete the parameters, ``problem_support``, :meth:`check`, then
    ``render_kernel``), so every template refuses the same way. Every other hook is declared
    below with its default: :meth:`check`, :meth:`seed_params`, :meth:`expected_instructions`,
    :meth:`efficiency`, and the class attributes ``stores_acc``, ``fuses_glu``, ``aot_only``,
    ``launcher``, ``schedule``.
    """

    id: ClassVar[str]
    backend: ClassVar[str]
    op: ClassVar[str] = "gemm"
    space: ClassVar[ParamSpace] = ParamSpace(())
    jinja: ClassVar[str | None] = None
    # whether the kernel can also store the product before its epilogue (GemmProblem.store_acc)
    stores_acc: ClassVar[bool] = False
    # built ahead of time only (``tilewright aot``): there is no launcher for it, so the
    # autotuner never offers it to a compiled model (``templates_for(..., jit=True)``)
    aot_only: ClassVar[bool] = False
    # whether it renders a grouped GEMM's fused gated product (GroupedGemmProblem.glu: gate
    # and up columns in one program); the grouped policy offers such problems only to these
    fuses_glu: ClassVar[bool] = False
    # a second jinja file beside ``jinja`` (Metal: the Python launcher module around the
    # shader), rendered with :meth:`render_jinja_file`; it counts in :attr:`render_sources`
    launcher: ClassVar[str | None] = None
    # a compiled kernel that spills registers fails its instruction check unless its template
    # says spilling is acceptable (tilewright.runtime.resources reads the spills)
    accepts_spills: ClassVar[bool] = False
    # the shape of its kernel, for the cost models: "tiled" (output tiles through an MMA, the
    # default) or "gemv" (one simdgroup/warp per output column, lanes along K: a weight stream,
    # offered for decode shapes; the grouped policy predicts it by its gemv model)
    schedule: ClassVar[str] = "tiled"

    @cached_property
    def folder(self) -> Path:
        return Path(inspect.getfile(type(self))).parent

    @cached_property
    def render_sources(self) -> tuple[Path, ...]:
        """Every file the rendered source comes from, found rather than listed: the modules of
        the class hierarchy (``base.py`` included), the tilewright template and IR modules they
        import (transitively), the jinja file and every jinja file it includes or imports."""
        mro = type(self).__mro__
        # every class from this one up to TemplateSpec: a template from outside the package
        # counts its own module too
        files = {Path(inspect.getfile(cls)) for cls in mro[:mro.index(TemplateSpec) + 1]}
        files |= _imported_render_modules(files)
        for name in (self.jinja, self.launcher):
            if name:
                files |= _jinja_closure(self.folder, name)
        return tuple(sorted(files))

    @cached_property
    def source_hash(self) -> str:
        """Hash of :attr:`render_sources`: changes when any file the source comes from does."""
        h = hashlib.sha256()
        root = TEMPLATES_ROOT.parent
        for path in self.render_sources:
            # a file outside the package by its name only: the hash must not depend on where
            # a user's checkout lives
            h.update(str(path.relative_to(root) if path.is_relative_to(root) else path.name).encode())
            h.update(path.read_bytes())
        return h.hexdigest()[:16]

    @property
    def language(self) -> Language:
        """The registered language this template is written in."""
        return get_language(self.backend)

    def render_jinja(self, **context: Any) -> str:
        assert self.jinja is not None
        return jinja_env(self.folder).get_template(self.jinja).render(**context)

    def render_jinja_file(self, name: str, **context: Any) -> str:
        """Render another jinja file of this template's folder (a :attr:`launcher`)."""
        return jinja_env(self.folder).get_template(name).render(**context)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("supports")
        if own is not None and not getattr(own, "_tw_guarded", False):
            cls.supports = _guarded_supports(own)  # type: ignore[method-assign]

    # -- what can run -----------------------------------------------------------------------------
    @_guarded_supports
    def supports(self, problem: Any, target: Target) -> Support:
        """Can this template run ``problem`` on ``target`` at all (any parameters)? Its
        language's toolchain must be usable here (:meth:`Language.check`), then
        :meth:`problem_support` decides. Not overridden: implement ``problem_support``.
        Never raises: a ``problem_support`` (or an overriding ``supports``) that raises is a
        refusal naming the error, warned once per template and error."""
        if (why := self.language.check()) is not None:
            return Support(False, why)
        return self.problem_support(problem, target)

    @abstractmethod
    def problem_support(self, problem: Any, target: Target) -> Support:
        """Can this template run ``problem`` on ``target`` (any parameters), leaving the
        toolchain out (rendering needs none)? ``Support(False, reason)`` names what is
        missing: the problem kind, a dtype, a layout, a target."""

    def check(self, params: Params, problem: Any, target: Target) -> str | None:
        """Why ``params`` (defaults filled in) are illegal for this problem on this target, or
        None when legal. Default: only the parameter space's own values."""
        return self.space_refusal(params)

    def seed_params(self, problem: Any, target: Target) -> list[dict[str, Any]] | None:
        """The template's own candidate parameters for ``problem`` on ``target``, best guess
        first (knobs left out take their defaults; the policy drops the ones :meth:`check`
        refuses), or None to let the kind's policy propose (the Triton family's
        BLOCK_*/GROUP_M/num_warps/num_stages tiles, the loop kernels' blocks). Templates
        whose knobs are their own (CuTeDSL's clusters, Metal's simdgroups) return a list."""
        return None

    def space_refusal(self, params: Params) -> str | None:
        """Why ``params`` (defaults filled in for knobs left out) are outside the space."""
        try:
            self.space.validate(self.space.complete(params))
        except ValueError as e:
            return str(e)
        return None

    # -- rendering --------------------------------------------------------------------------------
    def render(self, problem: Any, params: Params, target: Target) -> RenderedKernel:
        """Source text for ``problem`` with ``params`` (knobs left out take their defaults) on
        ``target``. The toolchain is not needed. Not overridden: implement
        :meth:`render_kernel`.

        Raises:
            UnsupportedProblemError: ``problem_support`` or ``check`` refuses (the message
                names the template, the problem or the parameters, and the reason).
        """
        params = self.space.complete(params)
        support = self.problem_support(problem, target)
        if not support:
            raise UnsupportedProblemError(f"{self.id} cannot run {problem.describe()}: {support.reason}")
        if (why := self.check(params, problem, target)) is not None:
            raise UnsupportedProblemError(f"{self.id} params {dict(params)} on {target.name}: {why}")
        return self.render_kernel(problem, params, target)

    @abstractmethod
    def render_kernel(self, problem: Any, params: dict[str, Any], target: Target) -> RenderedKernel:
        """Source text for a problem :meth:`problem_support` accepts and complete ``params``
        :meth:`check` accepts (called by :meth:`render` after those checks)."""

    def expected_instructions(self, problem: GemmProblem, params: Params,
                              target: Target) -> list[InstructionCheck]:
        """What the compiled kernel for this problem/params/target must contain (for AOT
        verification); empty for templates that are not compiled ahead of time."""
        return []

    def register_pressure(self, problem: GemmProblem, params: Params, target: Target) -> float:
        """How much slower the cost model takes this tile to run for the registers it needs
        (1.0: no effect; > 1 near or over the target's budget). Templates with a calibrated
        register estimate override it (Triton GEMMs: ``templates/triton/registers.py``)."""
        return 1.0

    def efficiency(self, target: Target) -> float:
        """Relative tensor-core efficiency the cost model credits this template with on a
        target (1.0 = the plain tiled kernel); > 1 for better data movement (TMA, TDM)."""
        return 1.0

    def __repr__(self) -> str:
        return f"<template {self.id} {self.source_hash}>"
