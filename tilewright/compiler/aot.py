"""``tilewright aot``: lower a model once, then build its kernels for chips this machine lacks.

Nothing can be timed, so per target and problem (the GEMMs, the grouped GEMMs, the loop
kernels, pointwise and reduction, and the kernels of any other registered kind the pipeline
makes of the model) the problem's kind (:mod:`tilewright.kinds`) proposes tile shapes with its
policy, its cost model ranks them, and the best ``per_template`` of every template that supports
the problem are rendered and compiled (with their PDL twins where the template has a
PDL knob and ``TILEWRIGHT_PDL=auto`` leaves the choice to the device; in worker processes: see
:mod:`tilewright.runtime.aot`). Every built kernel is checked for the instructions its template
promises (:mod:`tilewright.runtime.verify`). The output folder holds each kernel's source and
every compile stage's artifact, plus ``manifest.json``: kernel, problem, target, template,
parameters, predicted time, artifact paths and hashes, build and check status.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from tilewright.autotune.cache import current_versions
from tilewright.compiler.capture import CapturedKernel, ModelSpec, capture_kernels, load_model
from tilewright.compiler.aot_written import build_language, plan_language
from tilewright.errors import UnsupportedProblemError
from tilewright.kinds import kind_name, kind_of
from tilewright.runtime.aot import CompileJob, CompileResult, compile_jobs
from tilewright.runtime.languages import Language, aot_writer_for, get_language
from tilewright.runtime.resources import Resources, read_resources
from tilewright.runtime.targets import Target, get_target
from tilewright.runtime.verify import verify
from tilewright.templates import TemplateSpec, templates_for

FORMAT = "tilewright-aot/1"


@dataclass
class AotKernel:
    """One kernel of the build: what it computes, how it was chosen, how its build went."""

    name: str
    target: Target
    captured: CapturedKernel
    template: TemplateSpec
    params: dict[str, Any]
    predicted_ms: float
    bound: str
    job: CompileJob | None = None
    result: CompileResult | None = None
    verify_failures: list[str] = field(default_factory=list)
    verify_counts: dict[str, int] = field(default_factory=dict)
    verified: bool | None = None
    resources: Resources | None = None
    # why this candidate is not part of the build although it was compiled: it failed (build,
    # check, spill) and another kernel serves its problem on its target (aot_replace.py)
    dropped: str | None = None

    @property
    def good(self) -> bool:
        """Built, and not refused by its instruction check (spills included)."""
        return bool(self.result and self.result.ok) and self.verified is not False

    @property
    def kind(self) -> str:
        """The problem's kind: "gemm", "grouped_gemm", "pointwise", "reduction", ..."""
        return kind_name(self.captured.problem)

    def to_json(self) -> dict[str, Any]:
        p = self.captured.problem
        r = self.result
        return {
            "name": self.name, "kind": self.kind, "target": self.target.name, "problem": p.to_json(),
            "problem_text": p.describe(), "uses": self.captured.uses,
            "template": self.template.id, "template_hash": self.template.source_hash,
            "params": self.params, "predicted_ms": self.predicted_ms, "bound": self.bound,
            "status": r.status if r else "not built", "compile_seconds": r.seconds if r else None,
            "artifacts": r.artifacts if r else {}, "hashes": r.hashes if r else {},
            "metadata": r.metadata if r else {}, "error": r.error if r else "",
            "resources": self.resources.to_json() if self.resources else None,
            "aot": self.job.spec if self.job else None,
            "verify": None if self.verified is None else {
                "ok": self.verified, "failures": self.verify_failures, "counts": self.verify_counts},
            "dropped": self.dropped,
        }


@dataclass
class AotReport:
    """The whole build: kernels, refused (template, target, problem) pairs, where it went."""

    out_dir: Path
    model: str
    targets: list[Target]
    kernels: list[AotKernel]
    refused: list[dict[str, str]]
    train: bool = False

    @property
    def failed(self) -> list[AotKernel]:
        """Kernels that failed to build and that no other kernel replaces."""
        return [k for k in self.kernels if not (k.result and k.result.ok) and k.dropped is None]

    @property
    def verify_failed(self) -> list[AotKernel]:
        """Kernels that failed their instruction check and that no other kernel replaces."""
        return [k for k in self.kernels if k.verified is False and k.dropped is None]

    @property
    def dropped(self) -> list[AotKernel]:
        """Candidates that failed (a crash, a spill, a check) where another kernel serves the
        same problem on the same target: the build goes on without them."""
        return [k for k in self.kernels if k.dropped is not None]

    @property
    def ok(self) -> bool:
        return not self.failed and not self.verify_failed

    @property
    def uncovered(self) -> list[dict[str, str]]:
        """(target, problem) pairs no template built a kernel for, with every template's reason
        ("reasons": template -> reason): those problems run on ATen on that chip."""
        built = {(k.target.name, k.captured.problem.describe()) for k in self.kernels}
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for r in self.refused:
            key = (r["target"], r["problem"])
            if key not in built:
                out.setdefault(key, {"target": r["target"], "problem": r["problem"], "reasons": {}})
                out[key]["reasons"][r["template"]] = r["reason"]
        return list(out.values())

    def manifest(self) -> dict[str, Any]:
        statuses = [k.result.status if k.result else "not built" for k in self.kernels]
        kinds = [k.kind for k in self.kernels]
        return {
            "format": FORMAT, "model": self.model, "train": self.train,
            # every kernel's artifact path ("artifacts") is relative to this folder, beside the manifest
            "artifacts_root": "kernels",
            "targets": [t.name for t in self.targets], "versions": current_versions(),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "summary": {s: statuses.count(s) for s in sorted(set(statuses))}
            | {"kernels": len(self.kernels), "verify_failed": len(self.verify_failed),
               "uncovered": len(self.uncovered),
               "dropped": len(self.dropped),
               "spilling": sum(1 for k in self.kernels
                               if k.resources is not None and k.resources.spills and k.dropped is None),
               "by_kind": {k: kinds.count(k) for k in sorted(set(kinds))}},
            "kernels": [k.to_json() for k in self.kernels],
            "refused": self.refused,
        }


# knobs every GEMM template has; the name spells any others out (CTA_GROUP2, PDL1, ...)
_TILE_KNOBS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")


def describe_params(params: dict[str, Any], template: Any = None) -> str:
    """A kernel's parameters in a few characters ("128x128x64 w4 s3 pdl", "x1 r-row w1 desc"):
    the description of ``template``'s language (its ``AotWriter.describe``) where it has knobs
    of its own, else the shared one below."""
    writer = get_language(template.backend).aot_writer if template is not None else None
    text = writer.describe(params) if writer is not None else None
    if text is not None:
        return text
    if "BLOCK_M" not in params:  # a loop kernel
        text = f"x{params.get('XBLOCK', 1)}"
        if "RBLOCK" in params or "PERSISTENT" in params:  # looped rows may have no RBLOCK
            text += " r-row" if params.get("PERSISTENT") else f" r{params.get('RBLOCK', '-looped')}"
        # a kernel may have no warp knob (a Helion softmax on gfx950): KeyError was the build's end
        text += f" w{params['num_warps']}" if "num_warps" in params else ""
        return text + (" desc" if params.get("DESC") else "")
    # the tile dims a template has (an attention tile has no BLOCK_K), then its other knobs
    text = "x".join(str(params[k]) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K") if k in params)
    text += f" split{params['SPLIT']}" if "SPLIT" in params else ""
    # a template may have no warp or stage knob
    text += "".join(f" {c}{params[k]}" for k, c in (("num_warps", "w"), ("num_stages", "s")) if k in params)
    text += " 2cta" if params.get("CTA_GROUP") == 2 else ""
    return text + (" pdl" if params.get("PDL") else "") + (" desc" if params.get("DESC") else "")


def describe_problem(problem: Any) -> str:
    """A problem in a table cell, as its kind writes it: "mm 256x512x384 add[N]", "grouped_mm
    2d3d G=128 128x1536x2048 -" (no epilogue) or "rms_norm [48 x reduce 128]"."""
    return kind_of(problem).describe_short(problem)


def tile_name(params: dict) -> str:
    """A kernel's parameters in a folder name: a tiled kernel's "128x128x64w4s3" then every
    other knob ("-PDL1"), the warp and stage knobs only where the template has them; a loop
    kernel's "x1024-w4", "x4-row-w4", "x1-r2048-w8-desc"; else every knob ("BLOCK_M64-...")."""
    if all(k in params for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")):
        tile = f"{params['BLOCK_M']}x{params['BLOCK_N']}x{params['BLOCK_K']}"
        tile += "".join(f"{c}{params[k]}" for k, c in (("num_warps", "w"), ("num_stages", "s")) if k in params)
        return tile + "".join(f"-{k}{int(v) if isinstance(v, bool) else v}" for k, v in params.items()
                              if k not in _TILE_KNOBS)
    if "XBLOCK" in params:
        tile = f"x{params['XBLOCK']}"
        if "PERSISTENT" in params:  # a reduction: whole rows, or RBLOCK columns at a time
            tile += "-row" if params.get("PERSISTENT") else f"-r{params['RBLOCK']}"
        return tile + f"-w{params['num_warps']}" + ("-desc" if params.get("DESC") else "")
    return "-".join(f"{k}{int(v) if isinstance(v, bool) else v}" for k, v in params.items()) or "default"


_tile_name = tile_name  # the name callers knew


def _kernel_name(target: Target, captured: CapturedKernel, template: TemplateSpec, params: dict) -> str:
    """``<arch>/<problem label>-<template>-<tile>``: the problem part is its kind's
    (:meth:`~tilewright.kinds.ProblemKind.aot_label`)."""
    p = captured.problem
    return f"{target.arch}/{kind_of(p).aot_label(p)}-{template.id.replace('.', '_')}-{tile_name(params)}"


def _with_pdl_twins(ranked: list[tuple[float, dict]], per_template: int) -> list[tuple[float, dict]]:
    """The best ``per_template`` settings, each with its PDL twin (same tile, the other PDL
    value) when the policy proposed one: under ``TILEWRIGHT_PDL=auto`` only a measurement on
    the device can choose between them, so an ahead-of-time build carries both."""
    chosen = ranked[:per_template]
    for _, params in list(chosen):
        if "PDL" not in params:
            continue
        for ms, other in ranked[per_template:]:
            if other["PDL"] != params["PDL"] and {**other, "PDL": params["PDL"]} == params:
                chosen.append((ms, other))
                break
    return chosen


def spill_failure(template: TemplateSpec, resources: Resources | None) -> str | None:
    """The instruction check's verdict on a kernel's registers: a kernel that spills fails
    unless its template declares spilling acceptable (``TemplateSpec.accepts_spills``)."""
    if resources is None or not resources.spills or template.accepts_spills:
        return None
    return (f"spills registers ({resources.describe()}); {template.id} does not declare spilling "
            "acceptable (TemplateSpec.accepts_spills)")


def chain_pdl(cap: CapturedKernel, template: TemplateSpec, params: dict, target: Target) -> dict:
    """``params`` with ``PDL=True`` when the kernel is an end of a PDL edge (``cap.chained``)
    and its template takes PDL as an edge property (Triton: the knob is not tuned, the compiled
    graph sets it per edge, and a PDL kernel launched without PDL behaves as one without); a
    template that tunes PDL itself (CuTeDSL's ``seed_params`` twins) keeps its choice."""
    if (not cap.chained or params.get("PDL") is not False
            or template.seed_params(cap.problem, target) is not None
            or template.check({**params, "PDL": True}, cap.problem, target) is not None):
        return params
    return {**params, "PDL": True}


def plan(captured: Iterable[CapturedKernel], targets: Iterable[Target], *, per_template: int = 1
         ) -> tuple[list[AotKernel], list[dict[str, str]]]:
    """Choose and render the kernels to build (no compiling yet): GEMMs, grouped GEMMs (tiles
    ranked on their synthetic even offsets, :func:`tilewright.kinds.grouped_gemm.problem.synthetic_offsets`), loop
    kernels and those of any other registered kind, each kind through its own policy and cost
    model (:meth:`~tilewright.kinds.ProblemKind.ranked`, ``estimate``), and every template
    ``templates_for`` lists for the kind on the target's backend.

    Returns the kernels and the (template, target, problem) pairs refused, with the reason
    each template gave: refusals happen here, before any compiler runs.
    """
    kernels: list[AotKernel] = []
    refused: list[dict[str, str]] = []
    captured = list(captured)
    for target in targets:
        for cap in captured:
            kind = kind_of(cap.problem)
            templates = [t for t in templates_for(kind_name(cap.problem), target.backend) if t.backend != "aten"]
            for template in templates:
                support = template.supports(cap.problem, target)
                if not support:
                    refused.append({"target": target.name, "template": template.id,
                                    "problem": cap.problem.describe(), "reason": support.reason})
                    continue
                ranked = kind.ranked(cap.problem, target, template)
                if not ranked:
                    refused.append({"target": target.name, "template": template.id,
                                    "problem": cap.problem.describe(),
                                    "reason": "no parameter setting is legal on this target"})
                chosen = kind.aot_settings(cap.problem, target, ranked, _with_pdl_twins(ranked, per_template))
                for ms, params in chosen:
                    kernels.append(make_kernel(cap, target, template, ms, params))
    return kernels, refused


def make_kernel(cap: CapturedKernel, target: Target, template: TemplateSpec, ms: float, params: dict
                ) -> AotKernel:
    """The kernel of ``template`` with ``params`` for ``cap`` on ``target``, rendered, with its
    compile job (PDL chained where the graph chains it).

    Raises:
        UnsupportedProblemError: the template renders no ahead-of-time form.
    """
    params = chain_pdl(cap, template, params, target)
    est = kind_of(cap.problem).estimate(cap.problem, params, target, template)
    k = AotKernel(_kernel_name(target, cap, template, params), target, cap, template, dict(params), ms, est.bound)
    rendered = template.render(cap.problem, params, target)
    if rendered.aot is None:
        raise UnsupportedProblemError(f"{template.id} cannot be compiled ahead of time")
    k.job = CompileJob(k.name, rendered.source, rendered.aot.to_json(), target.aot_target)
    return k


def build(model: ModelSpec | str, targets: Iterable[str | Target], out_dir: Path | str, *,
          train: bool = False, per_template: int = 1, workers: int = 2, timeout_s: float = 600.0,
          check: bool = True, on_planned: Callable[[int], None] | None = None,
          on_result: Callable[[CompileResult], None] | None = None) -> AotReport:
    """Lower ``model`` once and build its kernels (GEMMs and loop kernels) for every target
    into ``out_dir``.

    Args:
        model: a :class:`ModelSpec`, ``"package.module:callable"`` or a ``.pt2`` file.
        targets: target names ("sm_90a", "cuda:sm_100a", "gfx950", ...).
        train: also build the backward graph's kernels.
        per_template: how many of each template's best-ranked settings to build per problem.
        workers: compile processes at once.
        timeout_s: a compile running longer than this is killed and reported.
        check: verify each artifact's instructions against its template's promise.

    Raises:
        UnknownTargetError: a target name not in the registry.
        InvalidInputError: a model spec that cannot be loaded.
    """
    spec = load_model(model) if isinstance(model, str) else model
    resolved = [get_target(t) for t in targets]
    # a target whose backend a language's AOT writer serves is written by it (Metal's shaders
    # syntax-checked, SYCL's built to SPIR-V: templates/<lang>/aot.py); the rest compile in workers
    written: dict[str, tuple[Language, list[Target]]] = {}
    compiled: list[Target] = []
    for t in resolved:
        lang = aot_writer_for(t.backend)
        if lang is not None:
            written.setdefault(lang.name, (lang, []))[1].append(t)
        elif t.aot_target is None:
            raise UnsupportedProblemError(f"{t.name} has no ahead-of-time compiler in tilewright")
        else:
            compiled.append(t)
    # fused as for the targets built (every AOT target compiles its kernels: none is the
    # CPU's interpreter, whose GEMMs leave epilogues to the loop kernels)
    captured = capture_kernels(spec, train=train, target=(compiled or resolved)[0] if resolved else None)
    kernels, refused = plan(captured, compiled, per_template=per_template)
    plans = [(lang, *plan_language(lang, captured, ts, per_template=per_template)) for lang, ts in
             sorted(written.values(), key=lambda w: (w[0].priority, w[0].name))]
    written_kernels = [k for _, ks, _, _ in plans for k in ks]
    refused += [r for _, _, rs, _ in plans for r in rs]
    if on_planned:
        on_planned(len(kernels) + len(written_kernels))
    out = Path(out_dir)
    root = out / "kernels"
    for lang, ks, _, rendered in plans:
        build_language(lang, ks, rendered, root, on_result=on_result)

    def land(batch: list[AotKernel]) -> None:
        results = compile_jobs([k.job for k in batch if k.job], root, workers=workers,
                               timeout_s=timeout_s, on_result=on_result)
        by_name = {r.name: r for r in results}
        for k in batch:
            k.result = by_name.get(k.name)
            if k.result is not None and k.result.ok:
                artifacts = {stage: root / rel for stage, rel in k.result.artifacts.items()}
                k.resources = read_resources(artifacts)
            if check and k.result is not None and k.result.ok:
                checks = k.template.expected_instructions(k.captured.problem, k.params, k.target)
                v = verify(artifacts, checks)
                k.verified, k.verify_failures, k.verify_counts = v.ok, list(v.failures), dict(v.counts)
                if (why := spill_failure(k.template, k.resources)) is not None:
                    k.verified = False
                    k.verify_failures.append(why)

    land(kernels)
    # a candidate that crashes, spills or fails its check costs itself: the next-ranked
    # setting of its template is built in its place, and failures another kernel covers drop
    from tilewright.compiler.aot_replace import replace_failures  # it builds kernels with make_kernel

    kernels += replace_failures(kernels, land)
    report = AotReport(out, spec.name or "model", resolved, kernels + written_kernels, refused, train)
    (out / "manifest.json").write_text(json.dumps(report.manifest(), indent=1))
    return report
