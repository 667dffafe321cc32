"""Gluon templates: explicit layouts and data movement (gfx1250 TDM), compiled ahead of time."""

from tilewright.templates.gluon.aot import compile_gluon
from tilewright.runtime.languages import Language
from tilewright.templates import BackendManifest
from tilewright.templates.gluon.gemm_tdm import GluonGemmTdm


def _unavailable() -> str | None:
    import importlib.util

    try:
        found = importlib.util.find_spec("triton.experimental.gluon") is not None
    except ImportError:  # no triton at all
        found = False
    return None if found else "the installed triton has no Gluon (triton.experimental.gluon): needs triton >= 3.5"


LANGUAGE = Language(
    name="gluon",
    description="Gluon kernels with explicit TDM/LDS pipelining (hip:gfx1250)",
    target_backends=("hip",),
    forcing="Gluon kernels only (the gfx1250 TDM GEMM); other problems on ATen",
    unavailable=_unavailable,
    aot_compile=compile_gluon,
    priority=20,
    pinned_knobs={"hip": {"num_stages": 2}},  # Triton's AMD stream pipeliner wants 2
)
MANIFEST = BackendManifest.of(LANGUAGE, (GluonGemmTdm(),))
