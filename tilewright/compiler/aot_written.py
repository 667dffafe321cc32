"""The ahead-of-time path shared by the targets whose kernels are written rather than compiled
in workers: those of a language with an AOT writer (:attr:`Language.aot_writer
<tilewright.runtime.languages.Language.aot_writer>`, e.g. Metal's ``mps``, SYCL's ``xpu``).
Plan every kernel with the kind's policy and cost model, render the best ``per_template``
settings of each of the language's templates, then write each kernel's files and check or build
them, one kernel at a time, with a ``job.json`` record per kernel so an unchanged kernel already
on disk is ``cached``.

The language's writer (``templates/<lang>/aot.py``, a
:class:`~tilewright.runtime.aot_writer.AotWriter`) says only what differs: how a kernel folder
is named, why a problem has no template, the build key, and what "build" means.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from tilewright.compiler.capture import CapturedKernel
from tilewright.kinds import get_kind, kind_name, kind_of
from tilewright.runtime.aot import CompileResult
from tilewright.runtime.aot_writer import Written, digest  # noqa: F401 - their old home
from tilewright.runtime.languages import Language
from tilewright.runtime.targets import Target
from tilewright.templates import TemplateSpec, templates_for
from tilewright.templates.base import RenderedKernel

KernelNamer = Callable[[Target, CapturedKernel, TemplateSpec, dict], str]


def estimate(kind: str, problem: Any, params: dict, target: Target, template: TemplateSpec):
    """The cost model's estimate (``.ms``, ``.bound``) of one kernel of any kind (the kind's
    :meth:`~tilewright.kinds.ProblemKind.estimate`)."""
    return get_kind(kind).estimate(problem, params, target, template)


def plan_written(captured: Iterable[CapturedKernel], targets: Iterable[Target], *,
                 templates: Callable[[str, Target], list[TemplateSpec]], kernel_name: KernelNamer,
                 none_reason: Callable[[str], str] | None = None, per_template: int = 1):
    """The kernels to write for ``targets``: per problem and template (``templates(kind,
    target)``), the best ``per_template`` settings by the cost model, rendered. A kernel named
    twice (the same problem in two layers) is planned once. ``none_reason(kind)``, when given,
    records a refusal for a problem no template serves.

    Returns (kernels as :class:`~tilewright.compiler.aot.AotKernel`, refusals as dicts of target,
    template, problem and reason, each kernel's :class:`RenderedKernel` by name).
    """
    from tilewright.compiler.aot import AotKernel  # aot imports the modules that import this

    kernels, refused, rendered = [], [], {}
    captured = list(captured)

    def refuse(target: Target, template_id: str, cap: CapturedKernel, reason: str) -> None:
        refused.append({"target": target.name, "template": template_id,
                        "problem": cap.problem.describe(), "reason": reason})

    for target in targets:
        for cap in captured:
            kind = kind_name(cap.problem)
            chosen = templates(kind, target)
            if not chosen and none_reason is not None:
                refuse(target, f"{target.backend}.{kind}", cap, none_reason(kind))
            for template in chosen:
                support = template.supports(cap.problem, target)
                if not support:
                    refuse(target, template.id, cap, support.reason)
                    continue
                ranked = kind_of(cap.problem).ranked(cap.problem, target, template)
                if not ranked:
                    refuse(target, template.id, cap, "no parameter setting is legal on this target")
                for ms, params in ranked[:per_template]:
                    est = estimate(kind, cap.problem, params, target, template)
                    k = AotKernel(kernel_name(target, cap, template, params), target, cap, template,
                                  dict(params), ms, est.bound)
                    if k.name in rendered:
                        continue
                    rendered[k.name] = template.render(cap.problem, params, target)
                    kernels.append(k)
    return kernels, refused, rendered


def _cached(record: Path, key: str, root: Path) -> CompileResult | None:
    """The earlier build of this exact kernel, if its record matches ``key`` and its files are there."""
    try:
        old = CompileResult(**json.loads(record.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if old.key != key or not old.ok or not all((root / f).is_file() for f in old.artifacts.values()):
        return None
    return CompileResult(old.name, key, "cached", old.seconds, old.artifacts, old.hashes, old.metadata)


def build_written(kernels: list, root: Path, *, key: Callable[[Any], str],
                  build: Callable[[Any, Path], Written],
                  on_result: Callable[[CompileResult], None] | None = None) -> None:
    """For each kernel: reuse its build when ``root/<name>/job.json`` records the same ``key(k)``
    and every artifact is still on disk; else ``build(k, folder)`` writes and checks its files.
    Sets each kernel's ``result``; a failure costs only that kernel (no record is kept, so the
    next run tries again)."""
    for k in kernels:
        folder = root / k.name
        record = folder / "job.json"
        build_key = key(k)
        result = _cached(record, build_key, root)
        if result is None:
            folder.mkdir(parents=True, exist_ok=True)
            start = time.perf_counter()
            w = build(k, folder)
            hashes = {stage: hashlib.sha256((root / rel).read_bytes()).hexdigest() for stage, rel in w.files.items()}
            result = CompileResult(k.name, build_key, w.status, time.perf_counter() - start, w.files, hashes,
                                   w.metadata, w.error)
            if result.ok:
                record.write_text(json.dumps(result.to_json(), indent=1))
        k.result = result
        if on_result:
            on_result(result)


def language_kernel_name(language: Language) -> KernelNamer:
    """``<arch>/<problem label>-<the writer's kernel folder>``: the problem part is its kind's
    (:meth:`~tilewright.kinds.ProblemKind.aot_label`), the rest the language's writer's."""
    writer = language.aot_writer

    def name(target: Target, cap: CapturedKernel, template: TemplateSpec, params: dict) -> str:
        p = cap.problem
        return f"{target.arch}/{kind_of(p).aot_label(p)}-{writer.kernel_folder(template.id, params)}"
    return name


def plan_language(language: Language, captured: Iterable[CapturedKernel], targets: Iterable[Target], *,
                  per_template: int = 1):
    """The kernels ``language``'s AOT writer writes for ``targets``: per problem and template of
    that language, the best ``per_template`` settings by the cost model, rendered (see
    :func:`plan_written`, whose triple it returns)."""
    writer = language.aot_writer
    if writer is None:
        raise ValueError(f"language {language.name} has no AOT writer")
    return plan_written(
        captured, targets, per_template=per_template, kernel_name=language_kernel_name(language),
        templates=lambda kind, t: [x for x in templates_for(kind, t.backend) if x.backend == language.name],
        none_reason=writer.none_reason)


def build_language(language: Language, kernels: list, rendered: dict[str, RenderedKernel], root: Path,
                   on_result: Callable[[CompileResult], None] | None = None) -> None:
    """Write, check or build ``kernels`` (planned by :func:`plan_language`) under ``root/<name>/``
    with ``language``'s AOT writer; sets each kernel's ``result``. An unchanged kernel already on
    disk is ``cached``."""
    writer = language.aot_writer
    build_written(kernels, root, key=lambda k: writer.key(k.name, rendered[k.name]),
                  build=lambda k, folder: writer.write(k.name, rendered[k.name], root), on_result=on_result)
