"""A language is its folder (issue 30): the shared code names no language, AOT writers and
device quirks come from the language and target registries, old import paths still work.

``compiler/`` and ``autotune/`` ask ``runtime.languages`` and ``runtime.targets``; each language
folder (``templates/<lang>/``) holds its ``Language``, templates, emitter and AOT writer.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import tilewright
from tilewright.errors import RegistrationError
from tilewright.runtime import languages as langs
from tilewright.runtime.aot_writer import AotWriter, Written, digest
from tilewright.runtime.languages import Language, aot_writer_for, get_language, register_language
from tilewright.runtime.targets import get_target, host_target

PACKAGE = Path(tilewright.__file__).parent
SHARED = sorted(str(p.relative_to(PACKAGE)) for d in ("compiler", "autotune")
                for p in (PACKAGE / d).rglob("*.py"))
# the target backends that are one language's device (its quirks are the target's), and the
# OpenCL CPU device the SYCL kernels run on here
DEVICE_WORDS = {"mps", "xpu", "opencl"}
# ATen is the fallback every kind has (and torch.ops.aten PyTorch's namespace), not a choice
NOT_A_CHOICE = {"aten"}
# (path, word) pairs that stay, with why
ALLOWED = {
    # deprecated re-export shims of the moved Metal/SYCL AOT writers, removed next release
    ("compiler/aot_metal.py", "*"), ("compiler/aot_sycl.py", "*"),
    # the tuning record's persisted toolchain-version field: Triton is a required dependency
    # (the interpreter, the AOT driver), and renaming the field would orphan every record
    ("autotune/cache.py", "triton"), ("autotune/cache_io.py", "triton"),
    # Inductor's option namespace (``triton.cudagraphs``, ``torch._inductor.config.triton``)
    ("compiler/cudagraphs.py", "triton"),
}
_TOKEN = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")


def _words(text: str) -> set[str]:
    return {t.lower() for t in _TOKEN.findall(text)}


def _code_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every identifier, import and string constant that is not a docstring:
    docstrings and comments may name languages as examples, code may not."""
    docs = {id(n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            out.append((n.lineno, n.value))
        elif isinstance(n, ast.Name):
            out.append((n.lineno, n.id))
        elif isinstance(n, ast.Attribute):
            out.append((n.lineno, n.attr))
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append((n.lineno, n.name))
        elif isinstance(n, ast.arg):
            out.append((n.lineno, n.arg))
        elif isinstance(n, ast.keyword) and n.arg:
            out.append((n.value.lineno, n.arg))
        elif isinstance(n, ast.ImportFrom):
            out.append((n.lineno, n.module or ""))
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out += [(n.lineno, f"{a.name} {a.asname or ''}") for a in n.names]
    return out


def test_the_language_words_come_from_the_registry():
    words = (set(langs.language_names()) - NOT_A_CHOICE) | DEVICE_WORDS
    assert {"triton", "cutedsl", "flydsl", "helion", "metal", "sycl", "gluon", "cpp", "mps", "xpu"} <= words


@pytest.mark.parametrize("path", SHARED)
def test_compiler_and_autotune_name_no_language(path):
    """A new language is its folder plus one registration: ``compiler/`` and ``autotune/`` ask
    the language and target registries and never name a language or a language's device."""
    if (path, "*") in ALLOWED:
        return
    words = (set(langs.language_names()) - NOT_A_CHOICE) | DEVICE_WORDS
    tree = ast.parse((PACKAGE / path).read_text())
    named = sorted({(line, w) for line, text in _code_names(tree) for w in _words(text) & words
                    if (path, w) not in ALLOWED})
    assert not named, f"{path} names languages at (line, word) {named}: ask tilewright.runtime.languages/targets"


def test_the_shared_code_holds_no_aot_writer():
    """The Metal and SYCL writers live in their language folders; compiler/ keeps only shims."""
    assert get_language("metal").aot_writer is importlib.import_module("tilewright.templates.metal.aot").WRITER
    assert get_language("sycl").aot_writer is importlib.import_module("tilewright.templates.sycl.aot").WRITER
    for old in ("aot_metal.py", "aot_sycl.py"):
        assert "deprecated" in ast.get_docstring(ast.parse((PACKAGE / "compiler" / old).read_text())).lower()


# -- the AOT-writer hook ------------------------------------------------------------------------
class _ToyWriter(AotWriter):
    def __init__(self):
        self.written = []

    def tile(self, params):
        return f"b{params['BLOCK']}"

    def key(self, name, rendered):
        return digest(source=rendered.source)

    def write(self, name, rendered, root):
        self.written.append(name)
        (root / name / "kernel.txt").write_text(rendered.source)
        status = "failed" if "bad" in rendered.source else "built"
        return Written(status, {"txt": f"{name}/kernel.txt"}, {"n": 1}, "bad source" if status == "failed" else "")


@pytest.fixture
def toy_language():
    made = []

    def make(**kw):
        lang = register_language(Language(**{**dict(
            name="toyaot", description="a test language", target_backends=("xpu",), forcing="its kernels only",
            aot_writer=_ToyWriter(), priority=1), **kw}))
        made.append(lang.name)
        return lang

    yield make
    for name in made:
        langs._LANGUAGES.pop(name, None)


def test_targets_go_to_the_writer_of_their_backends_language(toy_language):
    assert aot_writer_for("mps") is get_language("metal")
    assert aot_writer_for("xpu") is get_language("sycl")
    assert aot_writer_for("cuda") is None and aot_writer_for("cpu") is None  # compiled in workers / none
    toy = toy_language()  # a language registered from outside, ranked first for xpu, takes it
    assert aot_writer_for("xpu") is toy


def test_an_aot_writer_must_be_one(toy_language):
    with pytest.raises(RegistrationError, match="aot_writer must be a tilewright AotWriter"):
        toy_language(aot_writer=object())
    with pytest.raises(RegistrationError, match="pinned_knobs"):
        toy_language(pinned_knobs={"hip": 2})


def test_the_writer_writes_builds_and_reuses_kernels(toy_language, tmp_path):
    from tilewright.compiler.aot_written import build_language

    lang = toy_language()
    kernels = [SimpleNamespace(name=f"arch/k{i}", result=None) for i in range(2)]
    rendered = {"arch/k0": SimpleNamespace(source="good"), "arch/k1": SimpleNamespace(source="bad")}
    build_language(lang, kernels, rendered, tmp_path)
    assert [k.result.status for k in kernels] == ["built", "failed"]
    assert kernels[1].result.error == "bad source" and (tmp_path / "arch/k0/job.json").is_file()
    build_language(lang, kernels, rendered, tmp_path)  # unchanged: reused; a failure is tried again
    assert [k.result.status for k in kernels] == ["cached", "failed"]
    assert lang.aot_writer.written == ["arch/k0", "arch/k1", "arch/k1"]
    assert lang.aot_writer.kernel_folder("toyaot.gemm", {"BLOCK": 64}) == "toyaot_gemm-b64"


def test_the_old_aot_paths_warn_and_keep_working():
    import tilewright.compiler.aot_metal as aot_metal
    import tilewright.compiler.aot_sycl as aot_sycl

    for module in (aot_metal, aot_sycl):
        with pytest.warns(DeprecationWarning, match="deprecated"):
            importlib.reload(module)
    assert callable(aot_metal.plan_metal) and callable(aot_metal.build_metal) and aot_metal.CHECK
    assert callable(aot_sycl.plan_sycl) and aot_sycl.SPIRV_MAGIC == 0x07230203
    assert aot_sycl._split_images((3).to_bytes(8, "little") + b"abc") == [b"abc"]
    from tilewright.compiler.aot_written import Written as OldWritten

    assert OldWritten is Written


# -- device quirks are the target's --------------------------------------------------------------
def test_the_opencl_cpu_target_carries_its_quirks(monkeypatch):
    from tilewright.runtime import sycl

    sycl_cpu, cpu = get_target("xpu:opencl-cpu"), get_target("cpu")
    assert host_target("xpu") is sycl_cpu and host_target("cpu") is cpu and host_target("cuda") is None
    assert sycl_cpu.device_type == "cpu" and sycl_cpu.slow_first_launch and not cpu.slow_first_launch
    assert get_target("xpu").local_device() is None and get_target("xpu").local_devices() == []
    assert cpu.local_device() == torch.device("cpu") and cpu.local_devices() == ["cpu"]
    monkeypatch.setattr(sycl, "unavailable_reason", lambda: "no SYCL here: pip install 'tilewright[sycl]'")
    assert sycl_cpu.unavailable() == "no SYCL here: pip install 'tilewright[sycl]'"
    assert sycl_cpu.local_device() is None and sycl_cpu.local_devices() == []
    monkeypatch.setattr(sycl, "unavailable_reason", lambda: None)
    assert sycl_cpu.local_device() == torch.device("cpu") and sycl_cpu.local_devices() == ["cpu"]


def test_mps_is_measured_only_where_torch_has_it(monkeypatch):
    from tilewright.autotune.select import _measurable

    mps = get_target("mps")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert _measurable(mps) is None
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert _measurable(mps) == torch.device("mps") and mps.local_devices() == []


def test_pinned_knobs_come_from_the_language():
    from tilewright.autotune.policy import POLICIES
    from tilewright.problem import GemmProblem
    from tilewright.templates import get_template

    assert get_language("triton").pinned("hip") == {"num_stages": 2} and get_language("triton").pinned("cuda") == {}
    assert langs.pinned_knobs("no-such-language", "hip") == {}
    problem = GemmProblem(M=512, N=512, K=512, dtype="bf16")
    template = get_template("triton.gemm")
    on_hip = POLICIES["gemm", "hip"]().tile_params(problem, template, get_target("gfx942"))
    on_cuda = POLICIES["gemm", "cuda"]().tile_params(problem, template, get_target("sm_90a"))
    assert on_hip and {p["num_stages"] for p in on_hip} == {2}
    assert {p["num_stages"] for p in on_cuda} != {2}


def test_a_language_runtime_lives_in_its_folder():
    """The SYCL, C++ and CuTeDSL runtimes and the Metal check moved into their language folders
    (the old names are aliases: tests/test_moved.py)."""
    for new in ("templates/sycl/runtime/sycl_shim.cpp", "templates/cpp/runtime/launch.c",
                "templates/metal/metal_shim.h", "templates/metal/check.py", "templates/cutedsl/runtime.py"):
        assert (PACKAGE / new).is_file(), new
    assert not (PACKAGE / "runtime" / "metal_shim.h").exists()
    assert sorted(p.name for p in (PACKAGE / "runtime" / "sycl").iterdir() if p.suffix != ".pyc"
                  and p.name != "__pycache__") == ["__init__.py"]


def test_the_runtime_layer_holds_no_language():
    """Each language's toolchain driver, launcher and AOT compile is its folder's: a module of
    runtime/ named after a language is an alias shim of its new path, and every language's
    ``aot_compile`` is defined under templates/ (Helion's is Triton's: Helion emits Triton)."""
    words = set(langs.language_names()) - NOT_A_CHOICE
    named = [p for p in (PACKAGE / "runtime").rglob("*.py")
             if _words(p.stem) & words or _words(p.parent.name) & words]
    named.append(PACKAGE / "runtime" / "pdl.py")  # what the installed Triton offers for PDL
    assert {p.stem for p in named} >= {"flydsl", "flydsl_launch", "cutedsl", "metal_check"}
    for p in named:
        assert "alias(__name__," in p.read_text(), f"runtime/{p.relative_to(PACKAGE / 'runtime')} is a language's"
    compilers = {lang.name: lang.aot_compile.__module__ for lang in langs.languages() if lang.aot_compile}
    assert compilers["triton"] == compilers["helion"] == "tilewright.templates.triton.aot"
    assert compilers["gluon"] == "tilewright.templates.gluon.aot"
    assert compilers["flydsl"] == "tilewright.templates.flydsl.runtime"
    assert all(m.startswith("tilewright.templates.") for m in compilers.values()), compilers


def test_the_old_aot_compile_names_warn_and_keep_working():
    from tilewright.runtime import aot
    from tilewright.templates.gluon.aot import compile_gluon
    from tilewright.templates.triton.aot import compile_triton

    for name, new in (("compile_triton", compile_triton), ("compile_gluon", compile_gluon)):
        with pytest.warns(DeprecationWarning, match=f"runtime.aot.{name} moved to tilewright.templates"):
            assert getattr(aot, name) is new
    with pytest.raises(AttributeError):
        aot.compile_metal  # noqa: B018 - no such name


def test_a_languages_own_knobs_are_described_by_its_writer(toy_language):
    """``tilewright aot``'s table describes SYCL's work-group and sub-tile knobs through SYCL's
    AOT writer (compiler/aot.py knows only the shared knobs), and any language's writer may."""
    from tilewright.compiler.aot import describe_params
    from tilewright.templates import get_template

    gemm = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 16, "THREAD_M": 2, "THREAD_N": 4}
    assert describe_params({"WG": 128}, get_template("sycl.reduction")) == "wg128"
    assert describe_params(gemm, get_template("sycl.gemm")) == "32x64x16 t2x4"
    assert describe_params(gemm) == "32x64x16"  # no language named: the shared knobs only
    tri = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 3}
    assert describe_params(tri, get_template("triton.gemm")) == "64x64x32 w4 s3"

    class Named(_ToyWriter):
        def describe(self, params):
            return f"blk{params['BLOCK']}"

    toy = toy_language(aot_writer=Named())
    assert describe_params({"BLOCK": 8}, SimpleNamespace(backend=toy.name)) == "blk8"


def test_cpu_target_accepts_the_backends_with_a_host_target(monkeypatch):
    """``config.cpu_target``'s choices are the target registry's (a backend with a target that
    runs on CPU tensors), not a list in _config.py."""
    import dataclasses

    from tilewright import _config, config
    from tilewright.errors import ConfigError
    from tilewright.runtime import targets

    assert _config.cpu_targets() == ("cpu", "xpu") == targets.host_backends()
    assert all(host_target(b) is not None for b in _config.cpu_targets())
    consts = {n.value for n in ast.walk(ast.parse((PACKAGE / "_config.py").read_text()))
              if isinstance(n, ast.Constant)}
    assert "xpu" not in consts
    with pytest.raises(ConfigError, match="cpu_target='toyhost' is not one of"):
        with config.patch(cpu_target="toyhost"):
            pass
    toy = dataclasses.replace(get_target("cpu"), name="toyhost:cpu", backend="toyhost", tensors="cpu")
    monkeypatch.setitem(targets.TARGETS, toy.name, toy)
    assert "toyhost" in _config.cpu_targets() and host_target("toyhost") is toy
    with config.patch(cpu_target="toyhost"):
        assert config.cpu_target == "toyhost"


def test_a_bench_target_missing_its_toolchain_says_why(monkeypatch):
    """``tilewright bench`` on a target whose device needs a toolchain that is missing names the
    target's own reason (the target's quirk, not a SYCL special case in perf/)."""
    from tilewright.errors import TilewrightError
    from tilewright.perf.run import run_suite
    from tilewright.templates.sycl import runtime as sycl

    monkeypatch.setattr(sycl, "unavailable_reason", lambda: "no SYCL here: pip install 'tilewright[sycl]'")
    with pytest.raises(TilewrightError, match=r"xpu:opencl-cpu cannot run on this machine: no SYCL here"):
        run_suite("toy", [], get_target("xpu:opencl-cpu"), factory=None)
