"""C++ templates for the host CPU (the ``cpu`` target): loop kernels as scalar C++ per element,
vectorised by g++ and threaded with OpenMP over rows, and GEMM epilogues as one such pass after
ATen's product; built by :mod:`tilewright.runtime.cpp`."""

from tilewright.runtime.languages import Language
from tilewright.templates import BackendManifest
from tilewright.templates.cpp.gemm import CppGemm
from tilewright.templates.cpp.loops import CppPointwise, CppReduction


def _unavailable() -> str | None:
    from tilewright.runtime import cpp

    return cpp.unavailable_reason()


LANGUAGE = Language(
    name="cpp",
    description="C++ loop kernels and GEMM epilogues for the host CPU (g++ -O3 -march=native -fopenmp, "
                "vectorised, cached by hash)",
    target_backends=("cpu",),
    forcing="C++ loop kernels and GEMM epilogues on the cpu target, the products ATen's",
    unavailable=_unavailable,
    priority=70,
)
MANIFEST = BackendManifest.of(LANGUAGE, (CppPointwise(), CppReduction(), CppGemm()))
