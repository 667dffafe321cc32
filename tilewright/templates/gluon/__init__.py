"""Gluon templates: explicit layouts and data movement (gfx1250 TDM), compiled ahead of time."""

from tilewright.templates import BackendManifest
from tilewright.templates.gluon.gemm_tdm import GluonGemmTdm

MANIFEST = BackendManifest(
    name="gluon",
    description="Gluon kernels with explicit TDM/LDS pipelining (hip:gfx1250)",
    target_backends=("hip",),
    templates=(GluonGemmTdm(),),
)
