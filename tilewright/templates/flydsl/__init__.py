"""FlyDSL templates (``flydsl``, ROCm/FlyDSL): gfx950 kernels written in FlyDSL's Python DSL,
rendered from jinja and compiled ahead of time, compile-only, in child processes
(:mod:`tilewright.runtime.flydsl`). Registering them needs neither FlyDSL nor a GPU.

Each template module adds its spec to ``TEMPLATES`` below (one import, one entry)."""

from tilewright.templates import BackendManifest

TEMPLATES: tuple = (
)

MANIFEST = BackendManifest(
    name="flydsl",
    description="FlyDSL kernels (flydsl) for gfx950: MFMA GEMMs with fused epilogues, grouped and "
                "MX block-scaled GEMMs, row kernels; built ahead of time, compile-only",
    target_backends=("hip",),
    templates=TEMPLATES,
)
