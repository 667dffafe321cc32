"""``tilewright aot --target mps``: the Metal language's AOT writer (its kernels written and
checked on any host).

The Triton path of :mod:`tilewright.compiler.aot` compiles to PTX/AMDGCN in worker processes.
Metal has no compiler off macOS, so for the ``mps`` target each kernel the policy ranks best
(per template) is rendered by the shared driver (:mod:`tilewright.compiler.aot_written`), and
this writer puts its shader in ``kernels/<name>/kernel.metal`` beside the launcher module
(``launcher.py``: ``torch.mps.compile_shader`` plus the launch geometry) and checks it with the
host syntax check (:func:`tilewright.templates.metal.check.check_shader`). A kernel's status is
``built`` when the check passes, ``failed`` with the compiler's message when it does not,
``cached`` when an identical earlier build is on disk. GEMMs go through ``metal.gemm`` the same
way (one it refuses, e.g. one that also stores its product, is recorded with the reason). On
macOS the manifest's sources compile for real with ``torch.mps.compile_shader``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tilewright.runtime.aot_writer import AotWriter, Written, digest
from tilewright.templates.metal.check import MetalShaderError, check_shader

CHECK = "host syntax check (g++/clang++ -fsyntax-only with templates/metal/metal_shim.h)"

# gemv kernels keep the folder names they always had, after the GEMM family they belong to
_FOLDER_TEMPLATE = {"metal.gemv": "metal_gemm"}


def tile(params: dict[str, Any]) -> str:
    """A Metal kernel's parameters in its folder name: ``32x32x16w4`` for a tiled kernel;
    threads, and a reduction's whole or looped rows, for a loop kernel (``w4-row``)."""
    if "BLOCK_M" in params:
        return "{BLOCK_M}x{BLOCK_N}x{BLOCK_K}w{num_warps}".format(**params)
    text = f"w{params['num_warps']}"
    if "PERSISTENT" in params:
        text += "-row" if params.get("PERSISTENT") else "-looped"
    return text


class MetalWriter(AotWriter):
    """Writes ``kernel.metal`` and ``launcher.py`` per kernel and runs the host syntax check.
    Folder names: ``apple-gpu/reduction_48x128_<hash8>-metal_reduction-w4-row``,
    ``apple-gpu/mm_48x384x128_bf16_<hash6>-metal_gemm-32x32x16w4``."""

    def template_folder(self, template_id: str) -> str:
        return _FOLDER_TEMPLATE.get(template_id, template_id.replace(".", "_"))

    def tile(self, params: dict[str, Any]) -> str:
        return tile(params)

    def none_reason(self, kind: str) -> str:
        return f"no Metal template for {kind} kernels (they run on ATen on MPS)"

    def key(self, name: str, rendered: Any) -> str:
        return digest(shader=rendered.meta["shader"], launcher=rendered.source, check=CHECK)

    def write(self, name: str, rendered: Any, root: Path) -> Written:
        folder = root / name
        (folder / "kernel.metal").write_text(rendered.meta["shader"])
        (folder / "launcher.py").write_text(rendered.source)
        meta = rendered.meta
        launch = {"kernel": meta["kernel"], "threads": meta["threads"], "group_size": meta["group_size"],
                  "threadgroup_bytes": meta["threadgroup_bytes"], "check": CHECK}
        files = {"metal": f"{name}/kernel.metal", "py": f"{name}/launcher.py"}
        try:
            check_shader(meta["shader"])
        except MetalShaderError as e:
            return Written("failed", files, launch, str(e))
        return Written("built", files, launch)


WRITER = MetalWriter()
