"""tilewright from a plain checkout on PYTHONPATH, nothing installed (the GPU machine's way:
bench/device_check.sh): ``backend="tilewright"`` resolves by name through ``import tilewright``,
not only through the installed package's entry point."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _site_without_tilewright(tmp_path: Path) -> Path:
    """A folder with this interpreter's site-packages minus tilewright's own install (its
    dist-info with the entry point, the editable finder and .pth): what ``python -S`` with this
    folder on PYTHONPATH sees is torch and the rest, and no trace of an installed tilewright."""
    site = Path(sysconfig.get_paths()["purelib"])
    view = tmp_path / "site"
    view.mkdir()
    for entry in site.iterdir():
        low = entry.name.lower()
        if "tilewright" in low or entry.suffix == ".pth":
            continue
        (view / entry.name).symlink_to(entry)
    return view


@pytest.mark.slow
def test_a_checkout_on_pythonpath_compiles_by_name(tmp_path):
    code = (
        "import importlib.metadata as md, sys, torch\n"
        "try:\n"
        "    md.distribution('tilewright'); sys.exit('tilewright is installed: the test proves nothing')\n"
        "except md.PackageNotFoundError:\n"
        "    pass\n"
        "assert not md.entry_points(group='torch_dynamo_backends').select(name='tilewright')\n"
        "import tilewright\n"
        "assert tilewright.__file__.startswith(sys.argv[1]), tilewright.__file__\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(), torch.nn.Linear(40, 8))\n"
        "x = torch.randn(5, 24)\n"
        "y = torch.compile(m, backend='tilewright')(x)\n"
        "ref = m.double()(x.double())\n"
        "err = ((y.double() - ref).norm() / ref.norm()).item()\n"
        "assert err < 1e-4, err\n"
        "assert 'tilewright' in torch._dynamo.list_backends()\n"
        "print('ok', err)\n"
    )
    # the package folder alone: an editable install leaves tilewright.egg-info (its metadata and
    # entry point) in the repository root, which a plain checkout does not have
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "tilewright").symlink_to(REPO / "tilewright")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(checkout), str(_site_without_tilewright(tmp_path))])
    out = subprocess.run([sys.executable, "-S", "-c", code, str(checkout)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr


def test_import_registers_without_importing_torch():
    code = ("import sys, tilewright; assert 'torch' not in sys.modules, 'import tilewright imported torch'; "
            "import torch._dynamo; assert 'tilewright' in torch._dynamo.list_backends(); "
            "from torch._dynamo.backends.registry import lookup_backend; "
            "fn = lookup_backend('tilewright'); "
            "from tilewright import _dynamo_registration as r; assert fn is r.tilewright, fn; print('ok')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_registration_after_dynamo_is_loaded_and_twice(monkeypatch):
    import torch._dynamo  # noqa: F401 - the registry is loaded before the call below
    from torch._dynamo.backends import registry

    from tilewright import _dynamo_registration as r

    monkeypatch.setattr(registry, "_COMPILER_FNS", {k: v for k, v in registry._COMPILER_FNS.items()
                                                    if k != "tilewright"})
    monkeypatch.setattr(registry, "_BACKENDS", {k: v for k, v in registry._BACKENDS.items()
                                                if k != "tilewright"})
    monkeypatch.setattr(registry, "_lazy_import", lambda: None)  # no entry point seen
    r.install()
    r.install()  # a second import (a reload) must not raise "duplicate name"
    assert registry.lookup_backend("tilewright") is r.tilewright


def test_an_entry_point_dynamo_found_first_is_left_to_dynamo(monkeypatch):
    """Regression: Dynamo loading the installed entry point imports tilewright, whose
    registration then took the name, and Dynamo's own registration failed ("duplicate name")."""
    import torch._dynamo  # noqa: F401
    from torch._dynamo.backends import registry

    from tilewright import _dynamo_registration as r
    from tilewright.compiler.backend import tilewright_backend

    class EntryPoint:  # what importlib.metadata gives Dynamo, loading runs `import tilewright`
        def load(self):
            r.install()
            return tilewright_backend

    monkeypatch.setattr(registry, "_COMPILER_FNS", {k: v for k, v in registry._COMPILER_FNS.items()
                                                    if k != "tilewright"})
    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS) | {"tilewright": EntryPoint()})
    assert registry.lookup_backend("tilewright") is tilewright_backend


def test_the_suite_runs_without_pytests_cache_plugin():
    """bench/device_check.sh runs the GPU tests with ``-p no:cacheprovider`` (no ``config.cache``):
    the suite's module ordering must not need it (it raised AttributeError at the session's end,
    failing the device check's gpu_tests part)."""
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-n", "0",
         "tests/test_scaled_mm.py", "-k", "refuse_wrong_counts"],
        cwd=repo, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(repo)})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
