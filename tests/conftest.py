"""Test setup: a private tuning cache per session, strict compilation, small helpers."""

from __future__ import annotations

import os
import tempfile

# before tilewright is imported anywhere: keep tests off the user's ~/.cache
_CACHE = tempfile.mkdtemp(prefix="tilewright-test-cache-")
os.environ.setdefault("TILEWRIGHT_CACHE_DIR", _CACHE)
os.environ["TILEWRIGHT_STRICT"] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import tilewright  # noqa: E402

tilewright.config.reload_env()


# Seconds each test module took (all phases, summed over its tests). xdist hands each worker a
# first chunk of consecutive tests and the rest as they finish, so a long module collected late
# leaves one core idle at the end: starting the longest modules first shortens `make test` by
# that tail. The committed file orders a fresh clone (CI); each run refreshes pytest's own cache,
# which orders the next run on the same checkout.
_DURATIONS_FILE = os.path.join(os.path.dirname(__file__), "module_seconds.json")
_DURATIONS_KEY = "tilewright/module_seconds"
_module_seconds: dict[str, float] = {}


def _known_module_seconds(config) -> dict[str, float]:
    import json

    known: dict[str, float] = {}
    try:
        with open(_DURATIONS_FILE) as f:
            known.update(json.load(f))
    except (OSError, ValueError):
        pass
    cache = getattr(config, "cache", None)  # absent under -p no:cacheprovider (bench/device_check.sh)
    if cache is not None:
        known.update(cache.get(_DURATIONS_KEY, {}))
    return known


def pytest_collection_modifyitems(config, items):
    """The longest modules first (a stable sort: a module's tests stay together and in order,
    so module-scoped fixtures are built once); GPU tests run where CUDA is, elsewhere they are
    skipped (bench/device_check.sh runs them)."""
    known = _known_module_seconds(config)
    items.sort(key=lambda item: -known.get(item.nodeid.split("::")[0], 0.0))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run bench/device_check.sh on one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    module = report.nodeid.split("::")[0]
    _module_seconds[module] = _module_seconds.get(module, 0.0) + report.duration


def pytest_sessionfinish(session):
    """The controller (or a run without xdist) keeps this run's module times for the next run's
    order; a run of a few files updates only theirs."""
    cache = getattr(session.config, "cache", None)
    if hasattr(session.config, "workerinput") or cache is None or not _module_seconds:
        return
    known = cache.get(_DURATIONS_KEY, {})
    known.update({m: round(s, 2) for m, s in _module_seconds.items()})
    cache.set(_DURATIONS_KEY, known)


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield


@pytest.fixture
def cpu():
    from tilewright.runtime.targets import get_target

    return get_target("cpu")


@pytest.fixture
def fresh_cache(tmp_path):
    """A tilewright config whose cache is empty and private to the test."""
    with tilewright.config.patch(cache_dir=str(tmp_path / "cache")):
        yield tmp_path / "cache"


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.detach().double(), ref.detach().double()
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item()


TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}
