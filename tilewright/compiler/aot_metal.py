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

from pathlib import Path
from typing import Callable, Iterable

from tilewright.compiler.aot_written import Written, build_written, digest, plan_written
from tilewright.compiler.capture import CapturedKernel
from tilewright.kinds import kind_of
from tilewright.runtime.aot import CompileResult
from tilewright.runtime.metal_check import MetalShaderError, check_shader
from tilewright.runtime.targets import Target
from tilewright.templates import TemplateSpec, templates_for
from tilewright.templates.base import RenderedKernel

CHECK = "host syntax check (g++/clang++ -fsyntax-only with runtime/metal_shim.h)"


# gemv kernels keep the folder names they always had, after the GEMM family they belong to
_FOLDER_TEMPLATE = {"metal.gemv": "metal_gemm"}


def kernel_name(target: Target, cap: CapturedKernel, template: TemplateSpec, params: dict) -> str:
    """``apple-gpu/reduction_48x128_<hash8>-metal_reduction-w4-row`` or
    ``apple-gpu/mm_48x384x128_bf16_<hash6>-metal_gemm-32x32x16w4`` (the folder of its files):
    the problem part is its kind's (:meth:`~tilewright.kinds.ProblemKind.aot_label`)."""
    p = cap.problem
    if "BLOCK_M" in params:  # a tiled kernel
        tile = "{BLOCK_M}x{BLOCK_N}x{BLOCK_K}w{num_warps}".format(**params)
    else:  # a loop kernel: threads, and a reduction's whole or looped rows
        tile = f"w{params['num_warps']}"
        if "PERSISTENT" in params:
            tile += "-row" if params.get("PERSISTENT") else "-looped"
    folder = _FOLDER_TEMPLATE.get(template.id, template.id.replace(".", "_"))
    return f"{target.arch}/{kind_of(p).aot_label(p)}-{folder}-{tile}"


def plan_metal(captured: Iterable[CapturedKernel], targets: Iterable[Target], *, per_template: int = 1):
    """The Metal kernels to write for ``targets`` (the ``mps`` ones): per problem and Metal
    template, the best ``per_template`` settings by the cost model, rendered. Returns
    (kernels as :class:`~tilewright.compiler.aot.AotKernel`, refusals, each kernel's
    :class:`~tilewright.templates.base.RenderedKernel` by name)."""
    return plan_written(
        captured, targets, per_template=per_template, kernel_name=kernel_name,
        templates=lambda kind, t: [x for x in templates_for(kind, t.backend) if x.backend != "aten"],
        none_reason=lambda kind: f"no Metal template for {kind} kernels (they run on ATen on MPS)")


def build_metal(kernels: list, rendered: dict[str, RenderedKernel], root: Path,
                on_result: Callable[[CompileResult], None] | None = None) -> None:
    """Write each kernel's shader and launcher under ``root/<name>/`` and syntax-check the
    shader; sets each kernel's ``result``. An unchanged kernel already on disk is ``cached``."""

    def key(k) -> str:
        r = rendered[k.name]
        return digest(shader=r.meta["shader"], launcher=r.source, check=CHECK)

    def build(k, folder: Path) -> Written:
        r = rendered[k.name]
        (folder / "kernel.metal").write_text(r.meta["shader"])
        (folder / "launcher.py").write_text(r.source)
        launch = {"kernel": r.meta["kernel"], "threads": r.meta["threads"], "group_size": r.meta["group_size"],
                  "threadgroup_bytes": r.meta["threadgroup_bytes"], "check": CHECK}
        files = {"metal": f"{k.name}/kernel.metal", "py": f"{k.name}/launcher.py"}
        try:
            check_shader(r.meta["shader"])
        except MetalShaderError as e:
            return Written("failed", files, launch, str(e))
        return Written("built", files, launch)

    build_written(kernels, root, key=key, build=build, on_result=on_result)
