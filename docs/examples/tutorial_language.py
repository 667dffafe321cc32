"""A language of one's own, registered from outside tilewright (docs/kernel-authors.md,
"Adding a language").

``tutorial`` is the language of a kernel library that writes its kernels in Triton: it reuses
Triton's compile driver and tilewright's module loader, so the object is short. A language with
a toolchain of its own fills the same fields with its own functions (tilewright's FlyDSL folder,
``tilewright/templates/flydsl/__init__.py``, is a complete one: a toolchain check that names the
fix, the toolchain's version in AOT keys, a compile-only AOT driver).

Its name is what ``tilewright.config.force_backend`` accepts and what its template ids start
with, so ``force_backend="tutorial"`` runs this library's kernels and nothing else of ours.
"""

from __future__ import annotations

import importlib.util

import tilewright
from tilewright.templates.triton.aot import compile_triton


def triton_missing() -> str | None:
    """Why this language cannot be used here (one line naming the fix), or None."""
    if importlib.util.find_spec("triton") is None:
        return "the tutorial kernels are Triton kernels: pip install triton"
    return None


LANGUAGE = tilewright.Language(
    name="tutorial",
    description="the kernel-author tutorial's Triton kernels (docs/kernel-authors.md)",
    target_backends=("cuda", "hip", "cpu"),
    forcing="the tutorial's kernels only; problems they do not serve run on ATen",
    unavailable=triton_missing,  # checked by every template's supports()
    aot_compile=compile_triton,  # `tilewright aot` builds its kernels with triton.compile
    priority=90,  # after tilewright's own languages where templates are listed
)


def register() -> None:
    """Register the language (registering the same object again is a no-op)."""
    tilewright.register_language(LANGUAGE)
