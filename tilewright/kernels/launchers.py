"""The public ops' kernels: the autotuner's choice for a problem, built once per process and per
value of the settings that change it (:func:`tuned_launcher`). Was ``tilewright.kernels.build``'s
second half; the factory it builds with is :mod:`tilewright.compiler.kernel_factory`."""

from __future__ import annotations

import threading
from typing import Any

import torch

from tilewright.compiler.kernel_factory import default_factory

_tuned: dict[tuple, object] = {}
_tuned_lock = threading.Lock()

CHOICE_SETTINGS = ("force_backend", "autotune", "max_candidates", "allow_tf32", "pdl",
                   "check_candidates", "cache_dir")
"""Settings that change which kernel the tuner picks for a problem (or the kernel's source): the
ops' launchers are keyed on them, so a call inside ``config.patch(...)`` uses the kernel chosen
under that block's settings, and the next call after it the one chosen under the old ones."""


def tuned_launcher(problem: Any, device: torch.device):
    """The autotuner's choice for ``problem`` on ``device`` under the current settings, built
    once per process and per value of :data:`CHOICE_SETTINGS`."""
    from tilewright._config import config
    from tilewright.autotune.select import select_gemm
    from tilewright.runtime.targets import detect_target

    config.raise_env_error()
    target = detect_target(device)
    key = (problem, target.name, *[getattr(config, name) for name in CHOICE_SETTINGS])
    launch = _tuned.get(key)
    if launch is None:
        with _tuned_lock:
            launch = _tuned.get(key)
            if launch is None:
                selection = select_gemm(problem, target, default_factory)
                launch = _tuned[key] = default_factory.build(problem, selection.winner, target)
    return launch
