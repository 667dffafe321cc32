"""``tilewright aot --target mps``: a model's Metal kernels, written and checked on any host.

The Triton path of :mod:`tilewright.compiler.aot` compiles to PTX/AMDGCN in worker processes.
Metal has no compiler off macOS, so for the ``mps`` target each loop kernel the policy ranks
best (per template) is rendered, its shader written as ``kernels/<name>/kernel.metal`` beside
the launcher module (``launcher.py``: ``torch.mps.compile_shader`` plus the launch geometry)
and checked with the host syntax check (:func:`tilewright.runtime.metal_check.check_shader`).
A kernel's status is ``built`` when the check passes, ``failed`` with the compiler's
message when it does not, ``cached`` when an identical earlier build is on disk. GEMMs go
through ``metal.gemm`` the same way (one it refuses, e.g. one that also stores its product, is
recorded with the reason). On macOS the manifest's sources compile for real with
``torch.mps.compile_shader``.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Callable, Iterable

from tilewright.autotune.cost_model import estimate_gemm, estimate_loop
from tilewright.autotune.kinds import kind_name
from tilewright.autotune.policy import policy_for
from tilewright.compiler.capture import CapturedKernel
from tilewright.problem import GemmProblem
from tilewright.runtime.aot import CompileResult
from tilewright.runtime.metal_check import MetalShaderError, check_shader
from tilewright.runtime.targets import Target
from tilewright.templates import TemplateSpec, templates_for
from tilewright.templates.base import RenderedKernel

CHECK = "host syntax check (g++/clang++ -fsyntax-only with runtime/metal_shim.h)"


def kernel_name(target: Target, cap: CapturedKernel, template: TemplateSpec, params: dict) -> str:
    """``apple-gpu/reduction_48x128_<hash8>-metal_reduction-w4-row`` or
    ``apple-gpu/mm_48x384x128_bf16_<hash6>-metal_gemm-32x32x16w4`` (the folder of its files)."""
    p = cap.problem
    if isinstance(p, GemmProblem):
        tile = "{BLOCK_M}x{BLOCK_N}x{BLOCK_K}w{num_warps}".format(**params)
        return f"{target.arch}/{p.op}_{p.M}x{p.N}x{p.K}_{p.dtype}_{p.stable_hash()[:6]}-metal_gemm-{tile}"
    numel = f"{p.xnumel}x{p.rnumel}" if p.kind == "reduction" else f"{p.xnumel}"
    tile = f"w{params['num_warps']}"
    if p.kind == "reduction":
        tile += "-row" if params.get("PERSISTENT") else "-looped"
    return f"{target.arch}/{p.kind}_{numel}_{p.stable_hash()[:8]}-{template.id.replace('.', '_')}-{tile}"


def plan_metal(captured: Iterable[CapturedKernel], targets: Iterable[Target], *, per_template: int = 1):
    """The Metal kernels to write for ``targets`` (the ``mps`` ones): per loop problem and Metal
    template, the best ``per_template`` settings by the cost model, rendered. Returns
    (kernels as :class:`~tilewright.compiler.aot.AotKernel`, refusals, each kernel's
    :class:`~tilewright.templates.base.RenderedKernel` by name)."""
    from tilewright.compiler.aot import AotKernel  # aot imports this module

    kernels, refused, rendered = [], [], {}
    captured = list(captured)
    for target in targets:
        for cap in captured:
            kind = kind_name(cap.problem)
            templates = [t for t in templates_for(kind, target.backend) if t.backend != "aten"]
            if not templates:
                refused.append({"target": target.name, "template": f"metal.{kind}",
                                "problem": cap.problem.describe(),
                                "reason": f"no Metal template for {kind} kernels (they run on ATen on MPS)"})
            for template in templates:
                support = template.supports(cap.problem, target)
                if not support:
                    refused.append({"target": target.name, "template": template.id,
                                    "problem": cap.problem.describe(), "reason": support.reason})
                    continue
                ranked = policy_for(kind, target).ranked(cap.problem, target, template)
                if not ranked:
                    refused.append({"target": target.name, "template": template.id,
                                    "problem": cap.problem.describe(),
                                    "reason": "no parameter setting is legal on this target"})
                for ms, params in ranked[:per_template]:
                    est = (estimate_gemm(cap.problem, params, target, efficiency=template.efficiency(target))
                           if kind == "gemm" else estimate_loop(cap.problem, params, target))
                    k = AotKernel(kernel_name(target, cap, template, params), target, cap, template,
                                  dict(params), ms, est.bound)
                    rendered[k.name] = template.render(cap.problem, params, target)
                    kernels.append(k)
    return kernels, refused, rendered


def build_metal(kernels: list, rendered: dict[str, RenderedKernel], root: Path,
                on_result: Callable[[CompileResult], None] | None = None) -> None:
    """Write each kernel's shader and launcher under ``root/<name>/`` and syntax-check the
    shader; sets each kernel's ``result``. An unchanged kernel already on disk is ``cached``."""
    for k in kernels:
        r = rendered[k.name]
        shader, launcher = r.meta["shader"], r.source
        key = hashlib.sha256(json.dumps({"shader": shader, "launcher": launcher, "check": CHECK}).encode()).hexdigest()
        folder = root / k.name
        files = {"metal": f"{k.name}/kernel.metal", "py": f"{k.name}/launcher.py"}
        launch = {"kernel": r.meta["kernel"], "threads": r.meta["threads"], "group_size": r.meta["group_size"],
                  "threadgroup_bytes": r.meta["threadgroup_bytes"], "check": CHECK}
        record = folder / "job.json"
        result = None
        if record.is_file():
            try:
                old = CompileResult(**json.loads(record.read_text()))
            except (ValueError, TypeError):
                old = None
            if old is not None and old.key == key and old.ok and all((root / f).is_file() for f in files.values()):
                result = CompileResult(k.name, key, "cached", old.seconds, old.artifacts, old.hashes, old.metadata)
        if result is None:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "kernel.metal").write_text(shader)
            (folder / "launcher.py").write_text(launcher)
            start = time.perf_counter()
            try:
                check_shader(shader)
                status, error = "built", ""
            except MetalShaderError as e:
                status, error = "failed", str(e)
            hashes = {stage: hashlib.sha256((root / rel).read_bytes()).hexdigest() for stage, rel in files.items()}
            result = CompileResult(k.name, key, status, time.perf_counter() - start, files, hashes, launch, error)
            if result.ok:
                record.write_text(json.dumps(result.to_json(), indent=1))
        k.result = result
        if on_result:
            on_result(result)
