"""Helion templates (``helion``, pytorch/helion): kernels written as ``@helion.kernel``
functions, turned into Triton by Helion's code generation for a config tilewright's tuner
picks (:mod:`tilewright.templates.helion.base`). JIT on CUDA and ROCm GPUs, the Triton
interpreter on the CPU, built ahead of time like Triton's own. Registering them needs no
Helion; binding and rendering do (the ``helion`` extra).

Each template module adds its spec to ``TEMPLATES`` below (one import, one entry). A kernel
written outside the package becomes a template with :func:`helion_template`.
"""

import functools
import importlib.util

from tilewright.templates.triton.aot import compile_triton
from tilewright.runtime.languages import Language
from tilewright.templates import BackendManifest
from tilewright.templates.helion.base import HelionTemplate, helion_version
from tilewright.templates.helion.calls import HelionCall
from tilewright.templates.helion.flydsl import HelionSoftmaxFlyDsl
from tilewright.templates.helion.gemm import HelionGemm
from tilewright.templates.helion.public import helion_template
from tilewright.templates.helion.rms_norm import HelionRmsNorm
from tilewright.templates.helion.softmax import HelionSoftmax

TEMPLATES: tuple = (HelionRmsNorm(), HelionSoftmax(), HelionGemm(), HelionSoftmaxFlyDsl())


def _unavailable() -> str | None:
    for package in ("helion", "triton"):
        if importlib.util.find_spec(package) is None:
            return f"{package} is not installed (pip install 'tilewright[helion]')"
    return _import_problem()


@functools.lru_cache(maxsize=1)
def _import_problem() -> str | None:
    """Why an installed helion does not import here (None: it does). Measured: helion 1.5.1
    under torch 2.11 fails on ``torch._inductor.runtime.triton_compat.IntelGPUError``; its
    templates are then refused with this reason instead of failing at each bind."""
    try:
        importlib.import_module("helion")
    except ImportError as e:
        import torch

        return (f"helion {helion_version()} does not import with torch {torch.__version__}: "
                f"{type(e).__name__}: {e}"[:300])
    return None


def _versions() -> dict[str, str]:
    return {"helion": helion_version()}


LANGUAGE = Language(
    name="helion",
    description="Helion kernels (@helion.kernel) rendered to Triton by Helion for the config "
                "tilewright's tuner picks: residual RMSNorm, softmax, GEMM with its epilogue",
    target_backends=("cuda", "hip", "cpu"),
    forcing="Helion templates only (run by the Triton interpreter on the cpu target); problems "
            "none of them serves run on ATen",
    unavailable=_unavailable,
    versions=_versions,
    aot_compile=compile_triton,  # the generated module is Triton: triton.compile builds it
    priority=80,  # after the languages written for tilewright: ties go to those
)
MANIFEST = BackendManifest.of(LANGUAGE, TEMPLATES)

__all__ = ["HelionCall", "HelionTemplate", "LANGUAGE", "MANIFEST", "helion_template"]
