"""Deprecated: the Metal AOT writer lives in its language's folder now,
:mod:`tilewright.templates.metal.aot` (``Language.aot_writer``), and ``tilewright aot`` finds it
through the language registry. This module keeps the old names working for one release.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Callable, Iterable

from tilewright.compiler.aot_written import build_language, language_kernel_name, plan_language
from tilewright.compiler.capture import CapturedKernel
from tilewright.runtime.aot import CompileResult
from tilewright.runtime.languages import get_language
from tilewright.runtime.targets import Target
from tilewright.templates import TemplateSpec
from tilewright.templates.base import RenderedKernel
from tilewright.templates.metal.aot import _FOLDER_TEMPLATE, CHECK  # noqa: F401 - re-exported

warnings.warn("tilewright.compiler.aot_metal is deprecated; the writer is tilewright.templates.metal.aot "
              "and tilewright.compiler.aot_written.plan_language/build_language drive it",
              DeprecationWarning, stacklevel=2)

_LANGUAGE = "metal"


def kernel_name(target: Target, cap: CapturedKernel, template: TemplateSpec, params: dict) -> str:
    """A kernel's folder (``apple-gpu/reduction_48x128_<hash8>-metal_reduction-w4-row``)."""
    return language_kernel_name(get_language(_LANGUAGE))(target, cap, template, params)


def plan_metal(captured: Iterable[CapturedKernel], targets: Iterable[Target], *, per_template: int = 1):
    """:func:`tilewright.compiler.aot_written.plan_language` for this language."""
    return plan_language(get_language(_LANGUAGE), captured, targets, per_template=per_template)


def build_metal(kernels: list, rendered: dict[str, RenderedKernel], root: Path,
                on_result: Callable[[CompileResult], None] | None = None) -> None:
    """:func:`tilewright.compiler.aot_written.build_language` for this language."""
    build_language(get_language(_LANGUAGE), kernels, rendered, root, on_result=on_result)
