"""Regression tests for the usability defects a new-user trial found (settings, warnings): one
test per defect, each named after what it guards."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import tilewright
from tilewright import Config
from tilewright._config import OTHER_ENV, unknown_env

ROOT = Path(__file__).parents[1]


# -- 1. ConfigError at the top level -------------------------------------------------------------
def test_config_error_is_importable_from_the_package():
    from tilewright import ConfigError

    assert ConfigError is tilewright.errors.ConfigError and "ConfigError" in tilewright.__all__
    with pytest.raises(ConfigError, match="graph_race"):
        with tilewright.config.patch(graph_race="sometimes"):
            pass


# -- 2. choice settings: any case, and a bad value lists the choices ----------------------------
def test_choice_settings_from_the_environment_accept_any_case():
    cfg = Config.from_env({"TILEWRIGHT_GRAPH_RACE": "OFF", "TILEWRIGHT_PDL": "On",
                           "TILEWRIGHT_ISOLATE": " AUTO ", "TILEWRIGHT_CPU_TARGET": "CPU",
                           "TILEWRIGHT_FORCE_BACKEND": "Triton, Helion"})
    assert (cfg.graph_race, cfg.pdl, cfg.isolate, cfg.cpu_target) == ("off", "on", "auto", "cpu")
    assert cfg.force_backend == "triton,helion"
    # force_backend read at import is checked on first use: the same spelling is accepted there
    deferred = Config()
    deferred.reload_env({"TILEWRIGHT_FORCE_BACKEND": "ATEN"}, defer_registry=True)
    deferred.raise_env_error()
    assert deferred.force_backend == "aten"


def test_paths_keep_their_case():
    cfg = Config.from_env({"TILEWRIGHT_CACHE_DIR": "/tmp/My Cache", "TILEWRIGHT_DEBUG_DIR": "/tmp/Dump"})
    assert cfg.cache_dir == "/tmp/My Cache" and cfg.debug_dir == "/tmp/Dump"


def test_choice_settings_set_in_code_accept_any_case():
    with tilewright.config.patch(graph_race="OFF", force_backend="ATen"):
        assert tilewright.config.graph_race == "off" and tilewright.config.force_backend == "aten"


@pytest.mark.parametrize("env,value,choices", [
    ("TILEWRIGHT_GRAPH_RACE", "sometimes", "auto, off"),
    ("TILEWRIGHT_PDL", "maybe", "off, on, auto"),
    ("TILEWRIGHT_ISOLATE", "yes", "auto, on, off"),
    ("TILEWRIGHT_CPU_TARGET", "gpu", "cpu, xpu"),
])
def test_a_bad_choice_names_the_variable_and_lists_the_choices(env, value, choices):
    with pytest.raises(tilewright.ConfigError) as e:
        Config.from_env({env: value})
    assert env in str(e.value) and f"is not one of {choices} " in str(e.value), str(e.value)


def test_a_bad_language_among_several_is_named():
    with pytest.raises(tilewright.ConfigError, match=r"'triton,cuda': 'cuda' is not one of auto, aten, triton"):
        Config.from_env({"TILEWRIGHT_FORCE_BACKEND": "triton,CUDA"})


# -- 3. a misspelt TILEWRIGHT_* variable warns ---------------------------------------------------
def test_unknown_env_names_the_closest_setting():
    got = dict(unknown_env({"TILEWRIGHT_GRAPH_RAC": "off", "TILEWRIGHT_bench_rep": "3",
                            "TILEWRIGHT_ZZZ": "1", "TILEWRIGHT_AUTOTUNE": "0", "OTHER": "x",
                            **{name: "1" for name in OTHER_ENV}}))
    assert got == {"TILEWRIGHT_GRAPH_RAC": "TILEWRIGHT_GRAPH_RACE",
                   "TILEWRIGHT_bench_rep": "TILEWRIGHT_BENCH_REP", "TILEWRIGHT_ZZZ": None}


def test_a_misspelt_env_var_warns_once_per_process(tmp_path):
    code = textwrap.dedent("""
        import tilewright
        tilewright.config.reload_env()   # read again: no second warning
        print("ok", tilewright.config.graph_race)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILEWRIGHT_")}
    env.update(TILEWRIGHT_GRAPH_RAC="off", TILEWRIGHT_CACHE_DIR=str(tmp_path),
               TILEWRIGHT_FLYDSL_ROCM=str(tmp_path))  # read by templates/flydsl/runtime.py: no warning
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and "ok auto" in out.stdout, out.stdout + out.stderr
    assert out.stderr.count("TILEWRIGHT_GRAPH_RAC ") == 1, out.stderr
    assert "did you mean TILEWRIGHT_GRAPH_RACE?" in out.stderr and "FLYDSL" not in out.stderr, out.stderr


def test_every_tilewright_variable_the_project_reads_is_known():
    """A TILEWRIGHT_* name that the package, the benches, CI or the tests set or read must be a
    setting or in OTHER_ENV, or setting it would draw the misspelling warning."""
    known = {env for _, env, _, _ in Config.describe()} | set(OTHER_ENV)
    # a string or a shell variable; not a module attribute a __getattr__ compares its name with
    # (a moved constant such as kinds/grouped_gemm/lower.py's TILEWRIGHT_GROUPED_MM)
    quoted = re.compile(r"""(?<!== )["'$]\{?(TILEWRIGHT_[A-Z0-9_]+)""")
    files = [p for d in ("tilewright", "tests", "bench", ".ci") for p in (ROOT / d).rglob("*")
             if p.is_file() and p.suffix in (".py", ".sh", "", ".yml", ".yaml", ".toml")]
    files += [ROOT / "Makefile", ROOT / "pyproject.toml"]
    found: dict[str, str] = {}
    for p in files:
        if p.name == Path(__file__).name or not p.exists():
            continue
        for name in quoted.findall(p.read_text(errors="replace")):
            found.setdefault(name, str(p.relative_to(ROOT)))
    unknown = {n: where for n, where in found.items() if n not in known}
    assert not unknown, f"add these to Config or tilewright._config.OTHER_ENV: {unknown}"
    assert "TILEWRIGHT_FLYDSL_ROCM" in found  # the scan does see the variables read outside Config


# -- 4. an empty batch -------------------------------------------------------------------------
def _no_degrees_of_freedom_warning(caught: list, capfd) -> None:
    # ATen called from C++ (torch.ops) writes its warning to the process's stderr, which no
    # warnings filter sees: both channels are checked
    python = [str(w.message) for w in caught if "degrees of freedom" in str(w.message)]
    err = capfd.readouterr().err
    assert not python, f"{len(python)} warnings, first: {python[0]}"
    assert "degrees of freedom" not in err, f"{err.count('degrees of freedom')} lines on stderr: {err[:500]}"


def test_an_empty_batch_tunes_and_trains_without_degrees_of_freedom_warnings(fresh_cache, capfd):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 8))
    x = torch.randn(0, 16)
    ref = m(x)
    ref.sum().backward()
    ref_grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    c = torch.compile(m, backend="tilewright")  # strict (conftest): a fallback would raise
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            outs = [c(x) for _ in range(4)]   # the first call tunes; the graph race's calls follow
        for _ in range(4):                    # training: the layer norm's weight gradient sums no rows
            m.zero_grad()
            y = c(x)
            y.sum().backward()
    _no_degrees_of_freedom_warning(caught, capfd)
    for out in [*outs, y]:
        assert out.shape == ref.shape == (0, 8)
    for p, g in zip(m.parameters(), ref_grads):
        assert p.grad is not None and torch.equal(p.grad, g)  # sums of nothing: zeros, as eager's


def test_the_unfused_candidate_declines_an_empty_kernel(cpu):
    import dataclasses

    from tilewright.autotune.loop_policy import program_candidates
    from tilewright.kinds import get_kind
    from tilewright.templates import get_template

    base = dataclasses.replace(get_kind("pointwise").examples()[0], unfused='{"steps": []}')
    template = get_template("aten.unfused_pointwise")
    assert template.supports(base, cpu) and len(program_candidates(base, cpu, rank=0)) == 1
    empty = base.with_sizes(z0=0)
    assert not template.supports(empty, cpu) and program_candidates(empty, cpu, rank=0) == []


# -- 5. forced Triton on the CPU -------------------------------------------------------------------
def test_forced_triton_on_the_cpu_raises_no_numpy_warnings(fresh_cache):
    torch.manual_seed(0)
    m = nn.Sequential(nn.LayerNorm(32), nn.Softmax(-1))
    x = torch.randn(6, 32) * 50  # large logits: the softmax's exp overflows in masked lanes
    ref = m.double()(x.double())
    m.float()
    with tilewright.config.patch(force_backend="triton", autotune=False):
        c = torch.compile(m, backend="tilewright")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.no_grad():
                out = c(x)  # each kernel is checked once, on special values (inf, NaN) too
    numpy_warnings = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught
                      if issubclass(w.category, RuntimeWarning) and re.search("numpy|triton", w.filename)]
    assert not numpy_warnings, numpy_warnings
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-5
