"""Moved (issue 30: ``kernels/`` holds the public ops only): the render-and-load factory is
:mod:`tilewright.compiler.kernel_factory`, the ops' tuned launchers :mod:`tilewright.kernels.launchers`.
This module re-exports both for one release, with a DeprecationWarning."""

import warnings

from tilewright.compiler.kernel_factory import (  # noqa: F401 - the old names
    TemplateKernelFactory, default_factory, render,
)
from tilewright.kernels.launchers import CHOICE_SETTINGS, tuned_launcher  # noqa: F401

warnings.warn("tilewright.kernels.build moved: import TemplateKernelFactory/default_factory/render from "
              "tilewright.compiler.kernel_factory and tuned_launcher from tilewright.kernels.launchers "
              "(tilewright.kernels.build is removed in the next release)", DeprecationWarning, stacklevel=2)

__all__ = ["CHOICE_SETTINGS", "TemplateKernelFactory", "default_factory", "render", "tuned_launcher"]
