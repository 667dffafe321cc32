"""The warmer on a Ray cluster: one task per problem, results merged into one cache.

Each task tunes its problem on the node Ray places it on (asking for one GPU when the target is
a GPU) into a private, temporary cache seeded with the records the driver already has for that
problem, and returns the cache entries; the driver merges them into its cache as tasks finish
and marks the problem done in the warmer's state, so a killed driver resumes like a local
warmer. Ray is an optional extra (``pip install 'tilewright[ray]'``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from tilewright.autotune.cache import ProblemKey, TuningCache
from tilewright.autotune.shapes import NamedProblem
from tilewright.errors import TilewrightError
from tilewright.runtime.targets import Target


def _tune_one(problem_json: dict, target_name: str, factory: Any, settings: dict,
              known: dict) -> dict:
    """Runs on a Ray worker: tune one problem, return its cache entries and winner."""
    from tilewright._config import config
    from tilewright.autotune.select import select_gemm
    from tilewright.kinds import problem_from_json
    from tilewright.runtime.targets import get_target

    with tempfile.TemporaryDirectory(prefix="tilewright-ray-") as tmp, \
            config.patch(**settings, cache_dir=tmp):
        cache = TuningCache(Path(tmp) / "tuning.json")
        if known:
            cache.merge(known)
        try:
            sel = select_gemm(problem_from_json(problem_json), get_target(target_name),
                              factory, cache=cache)
        except TilewrightError as e:
            return {"error": f"{type(e).__name__}: {e}", "entries": {}, "measured": 0}
        return {"entries": dict(cache.entries()), "winner": sel.winner.name, "error": None,
                "measured": sum(not r.from_cache for r in sel.results)}


def warm_on_ray(problems: Sequence[NamedProblem], target: Target, factory: Any,
                cache: TuningCache, finish: Callable[[str, str | None, int, str | None], None],
                *, address: str | None = None) -> None:
    """Tune ``problems`` as Ray tasks and merge their results into ``cache`` as they finish.

    Connects to ``address`` (or the running/ambient cluster); when no Ray is running, starts a
    local one and shuts it down afterwards.

    Raises:
        WarmError: Ray is not installed.
    """
    from tilewright.autotune.warm import WarmError, settings_for_workers

    try:
        import ray
    except ImportError:
        raise WarmError("--ray needs Ray: pip install 'tilewright[ray]'") from None
    started = False
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
        started = True
    try:
        gpu = target.backend in ("cuda", "hip")
        remote = ray.remote(num_gpus=1 if gpu else 0, num_cpus=1, max_retries=0)(_tune_one)
        settings = settings_for_workers()
        futures = {}
        for item in problems:
            digest = ProblemKey.for_problem(item.problem, target.name).digest
            known = {d: e for d, e in cache.entries() if d == digest}
            ref = remote.remote(item.problem.to_json(), target.name, factory, settings, known)
            futures[ref] = item.name
        while futures:
            ready, _ = ray.wait(list(futures), num_returns=1)
            for ref in ready:
                name = futures.pop(ref)
                try:
                    out = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - a lost task fails its problem only
                    finish(name, None, 0, f"ray task: {type(e).__name__}: {e}"[:500])
                    continue
                if out["entries"]:
                    cache.merge(out["entries"])
                finish(name, out.get("winner"), out["measured"], out["error"])
    finally:
        if started:
            ray.shutdown()
