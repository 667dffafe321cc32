"""C++ templates for the host CPU (the ``cpu`` target): loop kernels as scalar C++ per element,
vectorised by g++ and threaded with OpenMP over rows, GEMM epilogues as one such pass after
ATen's product, and GEMMs with a bias, activation or residual as one oneDNN call
(``gemm_onednn``); built by :mod:`tilewright.templates.cpp.runtime`."""

import re
from typing import Any

from tilewright.runtime.languages import Language
from tilewright.templates import BackendManifest
from tilewright.templates.cpp.attention import CppAttention
from tilewright.templates.cpp.gemm import CppGemm
from tilewright.templates.cpp.gemm_onednn import CppGemmOneDNN
from tilewright.templates.cpp.loops import CppPointwise, CppReduction


def _unavailable() -> str | None:
    from tilewright.templates.cpp import runtime as cpp

    return cpp.unavailable_reason()


# how the templates' modules (loops.py.jinja, gemm.py.jinja) hold their C++ source and build it
_MODULE_KERNEL = re.compile(
    r"^SOURCE = r'''(.*?)'''\n_KERNEL = _cpp\.kernel\(SOURCE, \"\w+\", name=\"(\w+)\"\)$", re.S | re.M)


def _prebuild(rendered: Any) -> None:
    """Build the library a rendered C++ module loads (``templates.cpp.runtime.build``: cached by hash, a
    file lock per library), so that loading the module finds it built. The autotuner runs this
    in background threads, outside the module loader's lock."""
    from tilewright.templates.cpp import runtime as cpp

    m = _MODULE_KERNEL.search(rendered.source)
    if m is not None:
        cpp.build(m.group(1), m.group(2))


LANGUAGE = Language(
    name="cpp",
    description="C++ loop kernels and GEMM epilogues for the host CPU (g++ -O3 -march=native -fopenmp, "
                "vectorised, cached by hash)",
    target_backends=("cpu",),
    forcing="C++ loop kernels and GEMM epilogues on the cpu target, the products ATen's",
    unavailable=_unavailable,
    priority=70,
    prebuild=_prebuild,
)
MANIFEST = BackendManifest.of(LANGUAGE, (CppPointwise(), CppReduction(), CppGemm(), CppGemmOneDNN(),
                                         CppAttention()))
