"""The ahead-of-time path shared by the targets whose kernels are written rather than compiled
by ``triton.compile`` in workers (Metal's ``mps``, SYCL's ``xpu``): plan every loop kernel and
GEMM with the kind's policy and cost model, render the best ``per_template`` settings of each
template, then write each kernel's files and check or build them, one kernel at a time, with a
``job.json`` record per kernel so an unchanged kernel already on disk is ``cached``.

:mod:`tilewright.compiler.aot_metal` and :mod:`tilewright.compiler.aot_sycl` say only what
differs: which templates, how a kernel folder is named, and what "build" means (a host syntax
check; the SYCL runtime's compile to SPIR-V).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from tilewright.compiler.capture import CapturedKernel
from tilewright.kinds import get_kind, kind_name, kind_of
from tilewright.runtime.aot import CompileResult
from tilewright.runtime.targets import Target
from tilewright.templates import TemplateSpec
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


@dataclass
class Written:
    """What building one written kernel gave: status "built" or "failed", the compiler's
    message, the artifacts (stage -> path relative to the output folder; every one is
    hashed) and metadata for the manifest."""

    status: str
    files: dict[str, str]
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str = ""


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
        digest = key(k)
        result = _cached(record, digest, root)
        if result is None:
            folder.mkdir(parents=True, exist_ok=True)
            start = time.perf_counter()
            w = build(k, folder)
            hashes = {stage: hashlib.sha256((root / rel).read_bytes()).hexdigest() for stage, rel in w.files.items()}
            result = CompileResult(k.name, digest, w.status, time.perf_counter() - start, w.files, hashes,
                                   w.metadata, w.error)
            if result.ok:
                record.write_text(json.dumps(result.to_json(), indent=1))
        k.result = result
        if on_result:
            on_result(result)


def digest(**facts: Any) -> str:
    """sha256 of ``facts`` as sorted JSON: a written kernel's build key."""
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()
