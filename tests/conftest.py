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


def pytest_collection_modifyitems(config, items):
    """GPU tests run where CUDA is; elsewhere they are skipped (bench/device_check.sh runs them)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run bench/device_check.sh on one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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
