"""The language registry and the template base's declared hooks (issue 19, part 1).

Every language is one object found by name; nothing shared lists them. Registration validates
(a bad language or template fails when registered, with the field and the fix named); a
language's availability gates its templates' ``supports`` (not their rendering); forcing accepts
every registered language; the AOT driver finds a job's compiler through its language.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

import tilewright
from tilewright.errors import ConfigError, RegistrationError
from tilewright.problem import GemmProblem
from tilewright.runtime import languages as langs
from tilewright.runtime.aot import CompileJob, compile_jobs
from tilewright.runtime.languages import Language, get_language, register_language
from tilewright.runtime.targets import get_target
from tilewright.templates import (
    SUPPORTED, TemplateSpec, get_template, load_entry_points, register_template, templates_for,
    unregister_template,
)
import tilewright.templates as registry

BUILTIN = ("aten", "triton", "gluon", "cutedsl", "metal", "sycl", "flydsl", "cpp", "helion")


@pytest.fixture
def scratch_language():
    """A language registered for one test, removed after it."""
    made: list[str] = []

    def make(name: str, **kw) -> Language:
        fields = dict(name=name, description="a test language", target_backends=("cpu",),
                      forcing="its kernels only")
        lang = register_language(Language(**{**fields, **kw}))
        made.append(name)
        return lang

    yield make
    for name in made:
        langs._LANGUAGES.pop(name, None)


def test_every_builtin_language_is_registered_and_can_be_forced():
    names = langs.language_names()
    assert set(BUILTIN) <= set(names)
    # priority order: ATen first, then the order the policies break ties in
    assert names[:len(BUILTIN)] == BUILTIN
    assert tilewright._config.force_backends()[0] == "auto"
    for name in BUILTIN:
        lang = get_language(name)
        assert lang.check() is None or isinstance(lang.check(), str)
        with tilewright.config.patch(force_backend=name):
            pass
    # each template folder's language serves its templates' targets
    for t in registry.all_templates():
        assert t.language.name == t.backend


def test_forced_language_from_the_environment_is_checked_when_read():
    cfg = tilewright.Config.from_env({"TILEWRIGHT_FORCE_BACKEND": "gluon"})
    assert cfg.force_backend == "gluon"
    with pytest.raises(ConfigError, match="not one of auto, aten, triton"):
        tilewright.Config.from_env({"TILEWRIGHT_FORCE_BACKEND": "cuda"})


def test_bad_env_value_for_a_registry_setting_is_raised_on_first_use_not_at_import():
    cfg = tilewright.Config()
    cfg.reload_env({"TILEWRIGHT_FORCE_BACKEND": "cuda"}, defer_registry=True)
    with pytest.raises(ConfigError, match="force_backend='cuda' is not one of"):
        cfg.raise_env_error()
    assert cfg.force_backend == "auto"  # the bad value is not left in force
    with pytest.raises(ConfigError, match="TILEWRIGHT_FORCE_BACKEND"):
        cfg.raise_env_error()  # and says so at every use, like any bad variable


@pytest.mark.parametrize("change, words", [
    (dict(name="Bad Name"), "lower-case identifier"),
    (dict(name="auto"), "other than auto"),
    (dict(target_backends=()), "target_backends"),
    (dict(forcing=""), "what forcing it means"),
    (dict(unavailable="yes"), "unavailable must be callable"),
    (dict(aot_compile=lambda job, root: None), "module-level function"),
])
def test_a_bad_language_is_refused_when_registered(change, words):
    fields = dict(name="testlang_bad", description="d", target_backends=("cpu",), forcing="f")
    with pytest.raises(RegistrationError, match=words):
        register_language(Language(**{**fields, **change}))
    assert "testlang_bad" not in langs._LANGUAGES


def test_a_language_name_is_taken_once(scratch_language):
    scratch_language("testlang_once")
    with pytest.raises(RegistrationError, match="already registered"):
        register_language(Language("testlang_once", "another", ("cpu",), "f"))
    with pytest.raises(RegistrationError, match="no language 'no_such_language'; registered: aten"):
        get_language("no_such_language")


class _Tiny(TemplateSpec):
    """A template of a test language: serves every GEMM, renders a comment."""

    id = "testlang_gate.tiny"
    backend = "testlang_gate"

    def problem_support(self, problem, target):
        return SUPPORTED

    def render_kernel(self, problem, params, target):
        return registry.RenderedKernel(self.id, params, target.name, "# nothing\n", "tiny")


GEMM = GemmProblem(M=64, N=64, K=64, dtype="fp32", out_dtype="fp32")


def test_an_unavailable_language_refuses_support_but_still_renders(scratch_language):
    scratch_language("testlang_gate", unavailable=lambda: "testlang's compiler is not installed: pip install it")
    t = _Tiny()
    cpu = get_target("cpu")
    why = t.supports(GEMM, cpu)
    assert not why and why.reason == "testlang's compiler is not installed: pip install it"
    assert t.problem_support(GEMM, cpu)
    assert t.render(GEMM, {}, cpu).source == "# nothing\n"  # rendering needs no toolchain


def test_a_raising_availability_probe_reads_as_unavailable(scratch_language):
    def probe():
        raise OSError("no such file: /opt/testlang")

    lang = scratch_language("testlang_probe", unavailable=probe)
    assert "OSError: no such file" in lang.check()


class _OverridesSupports(_Tiny):
    id = "testlang_gate.overrides"

    def supports(self, problem, target):  # the language check would be skipped
        return SUPPORTED


class _WrongPrefix(_Tiny):
    id = "triton.not_mine"


class _MissingJinja(_Tiny):
    id = "testlang_gate.missing"
    jinja = "no_such_file.py.jinja"


class _UnknownLanguage(_Tiny):
    id = "nolang.tiny"
    backend = "nolang"


@pytest.mark.parametrize("cls, words", [
    (_OverridesSupports, "overrides supports"),
    (_WrongPrefix, "must be 'testlang_gate.<name>'"),
    (_MissingJinja, "missing source"),
    (_UnknownLanguage, "no language 'nolang'"),
])
def test_a_bad_template_is_refused_when_registered(scratch_language, cls, words):
    scratch_language("testlang_gate")
    with pytest.raises(RegistrationError, match=words):
        register_template(cls())


def test_a_template_id_is_registered_once_and_can_be_removed(scratch_language):
    scratch_language("testlang_gate")
    t = register_template(_Tiny())
    try:
        assert register_template(t) is t  # the same object again: nothing happens
        with pytest.raises(RegistrationError, match="registered twice"):
            register_template(_Tiny())
        assert get_template(t.id) is t and t in templates_for("gemm", "cpu")
    finally:
        unregister_template(t.id)
    assert t not in templates_for("gemm", "cpu")
    with pytest.raises(KeyError):
        get_template(t.id)


def test_entry_points_register_languages_and_templates_and_skip_broken_ones(
        scratch_language, monkeypatch, caplog):
    lang = Language("testlang_ep", "from an entry point", ("cpu",), "its kernels only")

    class _EpTemplate(_Tiny):
        id = "testlang_ep.tiny"
        backend = "testlang_ep"

    def ep(name, obj):
        def load():
            if isinstance(obj, Exception):
                raise obj
            return obj
        return SimpleNamespace(name=name, value=f"pkg:{name}", load=load, dist=SimpleNamespace(name="pkg"))

    groups = {registry.LANGUAGE_GROUP: [ep("lang", lang)],
              registry.TEMPLATE_GROUP: [ep("broken", ImportError("no module named pkg.x")),
                                        ep("tiny", lambda: [_EpTemplate()])]}
    monkeypatch.setattr(registry, "_entry_points", lambda group: groups[group])
    with caplog.at_level(logging.WARNING, logger="tilewright.templates"):
        skipped = load_entry_points()
    try:
        assert skipped == ["broken: ImportError: no module named pkg.x"]
        assert "skipping entry point broken = pkg:broken" in caplog.text and "package pkg" in caplog.text
        assert get_language("testlang_ep") is lang
        assert get_template("testlang_ep.tiny").backend == "testlang_ep"
    finally:
        unregister_template("testlang_ep.tiny")
        langs._LANGUAGES.pop("testlang_ep", None)


def test_declared_hooks_have_defaults():
    t = _Tiny()
    cpu = get_target("cpu")
    assert t.seed_params(GEMM, cpu) is None  # the kind's policy proposes
    assert not t.fuses_glu and not t.stores_acc and not t.aot_only and t.launcher is None
    assert t.check({}, GEMM, cpu) is None and t.expected_instructions(GEMM, {}, cpu) == []
    assert t.efficiency(cpu) == 1.0


def test_render_preamble_is_the_base_classes(scratch_language):
    # every template refuses the same way: the id, the problem or the params, and the reason
    triton_gemm = get_template("triton.gemm")
    cpu = get_target("cpu")
    with pytest.raises(tilewright.errors.UnsupportedProblemError,
                       match=r"triton.gemm params .* on cpu: BLOCK_M=7 is not one of"):
        triton_gemm.render(GEMM, {"BLOCK_M": 7}, cpu)
    with pytest.raises(tilewright.errors.UnsupportedProblemError, match=r"^metal.gemm cannot run .*mps"):
        get_template("metal.gemm").render(GEMM, {}, cpu)


def test_aot_jobs_find_their_compiler_through_the_language(scratch_language, tmp_path):
    # a language without an AOT compiler, and one nobody registered: each job fails alone,
    # with the reason, and builds nothing
    scratch_language("testlang_noaot")
    spec = {"kernel": "k", "language": "testlang_noaot", "pointer_types": {}, "constexprs": {},
            "divisible_by_16": [], "options": {}, "int_type": "i32"}
    jobs = [CompileJob("noaot", "x = 1\n", spec, ("cuda", 90, 32)),
            CompileJob("unknown", "x = 1\n", {**spec, "language": "nolang"}, ("cuda", 90, 32))]
    res = compile_jobs(jobs, tmp_path, workers=1, timeout_s=60)
    assert res[0].status == "failed" and "language 'testlang_noaot' has no ahead-of-time compiler" in res[0].error
    assert res[1].status == "failed" and "no language 'nolang'" in res[1].error


def test_forcing_a_language_gives_its_templates_the_whole_candidate_budget():
    # bug: the policy spent its budget (2 on the interpreter) on other languages' templates and
    # the forced language's were then filtered out, leaving ATen ("no template supports")
    with tilewright.config.patch(force_backend="cutedsl"):
        forced = {t.backend for t in templates_for("gemm", "cuda", jit=True)}
        assert forced == {"aten", "cutedsl"}
        everything = {t.backend for t in templates_for("gemm", "cuda")}  # aot plans them all
        assert {"triton", "cutedsl"} <= everything
