"""Starting a graph's native builds before its first kernel is tuned.

The select stage tunes a graph's kernels one at a time. Each C++ candidate is a g++ run of about
a second; left to the tuner, one problem's builds would wait for the previous problem to be
tuned. Here every problem's generated candidates that the tuner will build
(:func:`tilewright.autotune.select.to_build`: not in the tuning cache, measured here) are handed
to their factory's ``prepare`` up front, which builds them in its background pool; tuning
problem *i* then finds its libraries built or being built. The factory's ``settle`` (called by
the tuner before it times anything) waits for all of them, so no timing shares the machine with
a compiler. Languages without a ``prebuild`` (Triton, the GPU languages) are left alone.
"""

from __future__ import annotations

import logging
from typing import Iterable

from tilewright.autotune.select import to_build
from tilewright.compiler.dispatch import KernelCall

log = logging.getLogger("tilewright.compiler")


def start_builds(calls: Iterable[KernelCall]) -> int:
    """Start the background builds of every call's candidates that tuning will build.

    Args:
        calls: the graph's kernel calls; fixed ones (forced to a candidate) are skipped.

    Returns:
        How many candidates were handed to a factory's ``prepare`` (each builds only if its
        language has a ``prebuild``).

    Never raises: a problem whose candidates cannot be listed or rendered here is tuned as
    before, and its error is met (and reported as one kernel's) by the tuner.
    """
    from tilewright._config import config, forced_languages
    from tilewright.runtime.languages import languages

    forced = set(forced_languages(config.force_backend))
    if forced and not forced & {lang.name for lang in languages() if lang.prebuild is not None}:
        # nothing forced builds ahead; listing candidates here would only bind kernels early
        # (a forced Helion kernel bound at its trace-time bucket aborted the interpreter later)
        return 0
    handed = 0
    for call in calls:
        prepare = getattr(call.factory, "prepare", None)
        if call.fixed is not None or prepare is None:
            continue
        try:
            problem = call.tuned_problem()
            candidates = to_build(problem, call.target)
            if candidates:
                prepare(problem, candidates, call.target)
                handed += len(candidates)
        except Exception as e:  # noqa: BLE001 - the tuner meets the same error for this kernel
            log.debug("no early build for %s: %s: %s", call.name, type(e).__name__, e)
    return handed
