"""The config object: typed env overrides, scoped patches, clear errors."""

from __future__ import annotations

import pytest

import tilewright
from tilewright import Config
from tilewright.errors import ConfigError


def test_env_overrides_parse_by_type():
    cfg = Config.from_env({"TILEWRIGHT_FORCE_BACKEND": "triton", "TILEWRIGHT_AUTOTUNE": "0",
                           "TILEWRIGHT_MAX_CANDIDATES": "7", "TILEWRIGHT_BENCH_BUDGET_MS": "12.5",
                           "TILEWRIGHT_CACHE_DIR": "/tmp/x"})
    assert cfg.force_backend == "triton" and cfg.autotune is False
    assert cfg.max_candidates == 7 and cfg.bench_budget_ms == 12.5 and cfg.cache_dir == "/tmp/x"


@pytest.mark.parametrize("env,value,match", [
    ("TILEWRIGHT_FORCE_BACKEND", "cuda", "not one of"),
    ("TILEWRIGHT_AUTOTUNE", "maybe", "not a valid bool"),
    ("TILEWRIGHT_MAX_CANDIDATES", "many", "not a valid int"),
])
def test_bad_env_values_name_the_variable(env, value, match):
    with pytest.raises(ConfigError, match=match) as e:
        Config.from_env({env: value})
    assert env in str(e.value)


def test_patch_restores_and_validates():
    before = tilewright.config.force_backend
    with tilewright.config.patch(force_backend="aten", max_candidates=1):
        assert tilewright.config.force_backend == "aten"
        assert tilewright.config.max_candidates == 1
    assert tilewright.config.force_backend == before
    with pytest.raises(ConfigError, match="unknown setting"):
        with tilewright.config.patch(no_such_setting=1):
            pass
    with pytest.raises(ConfigError, match="not one of"):
        with tilewright.config.patch(force_backend="metal"):
            pass


def test_every_setting_is_documented():
    rows = Config.describe()
    assert {r[0] for r in rows} == set(Config().as_dict())
    assert all(r[1].startswith("TILEWRIGHT_") and r[3] for r in rows)


def test_docs_list_every_setting():
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs/config.md").read_text()
    missing = [env for _, env, _, _ in Config.describe() if f"`{env}`" not in doc]
    assert not missing, f"docs/config.md lacks {missing}; regenerate its table from Config.describe()"


def test_values_are_checked_when_set_in_code():
    with pytest.raises(ConfigError, match="must be a bool"):
        tilewright.config.autotune = "maybe"
    with pytest.raises(ConfigError, match="below its minimum"):
        with tilewright.config.patch(max_candidates=0):
            pass
    with pytest.raises(ConfigError, match="below its minimum"):
        Config.from_env({"TILEWRIGHT_BENCH_TIE_PCT": "-5"})


def test_a_bad_env_var_does_not_break_import_but_the_first_compile_says_why():
    import subprocess
    import sys

    code = """
import tilewright, torch
try:
    torch.compile(torch.nn.Linear(4, 4), backend='tilewright')(torch.randn(2, 4))
except Exception as e:
    print('ERR', e)
"""
    import os

    env = {**os.environ, "TILEWRIGHT_AUTOTUNE": "maybe"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert "TILEWRIGHT_AUTOTUNE" in out.stdout and "not a valid bool" in out.stdout, out.stdout + out.stderr
    cli = subprocess.run([sys.executable, "-m", "tilewright", "config"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert cli.returncode == 2 and "TILEWRIGHT_AUTOTUNE" in cli.stdout and "Traceback" not in cli.stderr
