"""C++ templates for the host CPU (the ``cpu`` target): loop kernels as scalar C++ per element,
vectorised by g++ and threaded with OpenMP over rows, built by :mod:`tilewright.runtime.cpp`."""

from tilewright.runtime.languages import Language
from tilewright.templates import BackendManifest
from tilewright.templates.cpp.loops import CppPointwise, CppReduction


def _unavailable() -> str | None:
    from tilewright.runtime import cpp

    return cpp.unavailable_reason()


LANGUAGE = Language(
    name="cpp",
    description="C++ loop kernels for the host CPU (g++ -O3 -march=native -fopenmp, vectorised, cached by hash)",
    target_backends=("cpu",),
    forcing="C++ loop kernels on the cpu target (GEMMs stay ATen's)",
    unavailable=_unavailable,
    priority=40,
)
MANIFEST = BackendManifest.of(LANGUAGE, (CppPointwise(), CppReduction()))
