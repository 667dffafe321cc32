"""Metal templates for Apple GPUs (MPS): loop kernels, a simdgroup_matrix GEMM (also fp8 e4m3),
a gemv, a grouped GEMM and its decode gemv, split-row reductions for few long rows, compiled
on macOS by
``torch.mps.compile_shader``; elsewhere rendered and syntax-checked only
(:mod:`tilewright.templates.metal.check`)."""

from tilewright.runtime.languages import Language
from tilewright.templates import BackendManifest
from tilewright.templates.metal.aot import WRITER
from tilewright.templates.metal.gemm import MetalGemm, MetalGemv
from tilewright.templates.metal.grouped import MetalGroupedGemm
from tilewright.templates.metal.grouped_gemv import MetalGroupedGemv
from tilewright.templates.metal.loops import MetalPointwise, MetalReduction
from tilewright.templates.metal.split_reduce import MetalSplitReduction

LANGUAGE = Language(
    name="metal",
    description="Metal Shading Language kernels for MPS (compile_shader on macOS; syntax-checked elsewhere)",
    target_backends=("mps",),
    # rendering needs nothing; a launcher refuses in one line off macOS (templates/metal/check.py)
    forcing="Metal kernels only, on the mps target (GEMMs, gemv, grouped GEMMs, loop kernels)",
    priority=40,
    aot_writer=WRITER,  # tilewright aot writes and checks its kernels: aot.py
)
MANIFEST = BackendManifest.of(LANGUAGE, (MetalPointwise(), MetalReduction(), MetalGemm(), MetalGemv(),
                                         MetalGroupedGemm(), MetalGroupedGemv(), MetalSplitReduction()))
