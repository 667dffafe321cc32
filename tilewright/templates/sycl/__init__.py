"""SYCL templates (Intel XPU): loop kernels and a tiled GEMM as free-function nd_range kernels,
compiled at run time by the SYCL runtime; on a host without an Intel GPU they run on the OpenCL CPU device."""

from tilewright.runtime.languages import Language
from tilewright.templates import BackendManifest
from tilewright.templates.sycl.aot import WRITER
from tilewright.templates.sycl.gemm import SyclGemm
from tilewright.templates.sycl.loops import SyclPointwise, SyclReduction


def _unavailable() -> str | None:
    from tilewright.templates.sycl import runtime as sycl

    return sycl.unavailable_reason()


LANGUAGE = Language(
    name="sycl",
    description="SYCL free-function kernels: loops, tiled GEMM (kernel_compiler at run time; "
                "OpenCL CPU device without an Intel GPU)",
    target_backends=("xpu",),
    forcing="SYCL GEMMs and loop kernels, on the xpu target (see cpu_target)",
    unavailable=_unavailable,
    priority=50,
    aot_writer=WRITER,  # tilewright aot writes and checks its kernels: aot.py
)
MANIFEST = BackendManifest.of(LANGUAGE, (SyclPointwise(), SyclReduction(), SyclGemm()))
