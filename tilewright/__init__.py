"""tilewright: compiler-centric kernel generation for PyTorch.

``torch.compile(model, backend="tilewright")`` lowers the captured graph, fuses epilogues into its
GEMMs, and runs each GEMM on the kernel the autotuner picks (generated Triton or ATen).
Settings live in :data:`tilewright.config`.
"""

from typing import Any

from tilewright._config import Config, config
# the errors a user catches: bad settings, bad tensors handed to an op (tilewright.errors has all)
from tilewright.errors import ConfigError, InvalidInputError, TilewrightError

__version__ = "0.1.0"

# backend="tilewright" by name without the installed entry point (a checkout on PYTHONPATH);
# no torch import here: the name is registered when Dynamo's registry loads
from tilewright import _dynamo_registration

_dynamo_registration.install()

# the registries' public calls, imported when first used (so ``import tilewright`` stays light):
# a language or template registered from a user's code is a candidate like the package's own
# (docs/kernel-authors.md)
_LAZY = {
    "Language": "tilewright.runtime.languages",
    # needs Helion (pip install 'tilewright[helion]'); not in __all__, so `import *` never imports it
    "helion_template": "tilewright.templates.helion",
    "register_language": "tilewright.runtime.languages",
    "register_template": "tilewright.templates",
    "TemplateSpec": "tilewright.templates.base",
    "unregister_language": "tilewright.templates",
    "unregister_template": "tilewright.templates",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tilewright' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def launch_report(model, *args, train: bool = False, **kwargs):
    """Compile ``model`` with tilewright, call it once on the example inputs (``train=True``:
    also a backward) and return the kernel launches per call of each compiled graph (GEMMs,
    generated kernels, ATen calls, and eager's count for the same graph): ``print(report)``.
    Full description: :func:`tilewright.compiler.launches.launch_report`."""
    from tilewright.compiler.launches import launch_report as impl  # the compiler loads on use

    return impl(model, *args, train=train, **kwargs)


def collect_reports():
    """A ``with`` block that gathers the :class:`~tilewright.compiler.report.GraphReport` of every
    graph tilewright compiles inside it, for an ordinary ``torch.compile`` call (no recompile,
    unlike :func:`launch_report`). Graphs compile on a compiled model's first call (and on a
    recompile), so make that call inside the block::

        with tilewright.collect_reports() as reports:     # a list, filled as graphs compile
            out = compiled(x)
        for r in reports:
            print(r.graph_id, r.kind, r.fallback, r.kernel_fallbacks, r.kernel_counts)

    A report is one object that tilewright keeps updating: a kernel that falls back to ATen in a
    later call (outside the block) is appended to its ``kernel_fallbacks`` there too. Blocks may
    nest; each gets every graph compiled (in any thread) while it is open.
    """
    from tilewright.compiler.report import collect_reports as impl  # the compiler loads on use

    return impl()


__all__ = ["Config", "ConfigError", "InvalidInputError", "Language", "TemplateSpec", "TilewrightError",
           "__version__", "collect_reports", "config", "launch_report", "register_language", "register_template",
           "unregister_language", "unregister_template"]
