"""Kernel templates, one folder per language, each folder with a short manifest.

``templates_for(op, target)`` lists the registered templates that can serve an op on a target;
``get_template(id)`` finds one by id. Nothing here lists the languages: every sub-package of
this folder that declares a ``LANGUAGE`` (a :class:`~tilewright.runtime.languages.Language`)
and a ``MANIFEST`` (its templates) is registered when the registry is first used, then every
``tilewright.languages`` and ``tilewright.templates`` entry point of the installed packages.
Code outside the package registers with :func:`register_template` / ``register_language``.
Everything is validated when registered (:func:`validate_template`), so a template with a
broken id, parameter space or missing source fails at registration, not at tuning time.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import pkgutil
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Iterable

from tilewright.errors import RegistrationError
from tilewright.runtime.languages import Language, drop_language, get_language, languages, register_language
from tilewright.templates.base import (
    Knob, ParamSpace, RenderedKernel, Support, SUPPORTED, TemplateSpec, powers_of_two,
)
from tilewright.templates.epilogues import computes_epilogue

log = logging.getLogger("tilewright.templates")

# entry-point groups other packages put their languages and templates in (pyproject.toml:
# [project.entry-points."tilewright.templates"] my_rmsnorm = "mypkg.kernels:TEMPLATE")
LANGUAGE_GROUP = "tilewright.languages"
TEMPLATE_GROUP = "tilewright.templates"


@dataclass(frozen=True)
class BackendManifest:
    """What one language folder provides.

    Attributes:
        name: the language's name, which is also the folder name ("triton", "aten").
        description: one line for ``tilewright templates``.
        target_backends: target backends its kernels can run on ("cuda", "hip", "cpu", ...).
        templates: its template specs.
    """

    name: str
    description: str
    target_backends: tuple[str, ...]
    templates: tuple[TemplateSpec, ...]

    @classmethod
    def of(cls, language: Language, templates: Iterable[TemplateSpec]) -> "BackendManifest":
        """The manifest of ``language``'s templates (name, description and targets its own)."""
        return cls(language.name, language.description, language.target_backends, tuple(templates))


_lock = threading.RLock()
_TEMPLATES: dict[str, TemplateSpec] = {}
_BY_LANGUAGE: dict[str, list[TemplateSpec]] = {}
_discovered = False
_BUILTIN: set[str] = set()  # the ids the package's own language folders registered
# what the scan of the folders and entry points registered (the rest came from calls)
_SCANNED_LANGUAGES: set[str] = set()
_SCANNED_TEMPLATES: set[str] = set()


def validate_template(t: Any) -> None:
    """Check a template before it is registered.

    Raises:
        RegistrationError: not a :class:`TemplateSpec`; an id that does not start with its
            language's name; a language that is not registered; an id taken by another
            template; a default parameter setting outside its own space; a missing jinja file;
            ``supports`` or ``render`` overridden (the base class checks the language and runs
            the preamble: implement ``problem_support`` and ``render_kernel``).
    """
    if not isinstance(t, TemplateSpec):
        raise RegistrationError(f"templates are TemplateSpec instances, got {type(t).__name__}")
    tid, backend = getattr(t, "id", None), getattr(t, "backend", None)
    if not isinstance(tid, str) or not isinstance(backend, str):
        raise RegistrationError(f"{type(t).__name__} must set the class attributes id and backend")
    try:
        get_language(backend)
    except RegistrationError as e:
        raise RegistrationError(f"template {tid}: {e}") from None
    if not tid.startswith(backend + ".") or len(tid) == len(backend) + 1:
        raise RegistrationError(f"template id {tid!r} must be '{backend}.<name>' (its language, a dot, a name)")
    if not isinstance(t.op, str) or not t.op:
        raise RegistrationError(f"template {tid}: op must name the problem kind it serves (gemm, pointwise, ...)")
    for method, instead in (("supports", "problem_support"), ("render", "render_kernel")):
        if getattr(type(t), method) is not getattr(TemplateSpec, method):
            raise RegistrationError(
                f"template {tid} overrides {method}(); implement {instead}() instead (the base "
                f"class's {method} checks the language and runs the shared preamble)")
    try:
        t.space.validate(t.space.default())
    except ValueError as e:
        raise RegistrationError(f"template {tid}: its default parameters are invalid: {e}") from None
    for f in (t.jinja, t.launcher):
        if f and not (t.folder / f).is_file():
            raise RegistrationError(f"template {tid}: missing source {t.folder / f}")
    other = _TEMPLATES.get(tid)
    if other is not None and other is not t:
        raise RegistrationError(f"template id {tid!r} registered twice ({type(other).__module__} "
                                f"and {type(t).__module__})")


def register(manifest: BackendManifest) -> None:
    """Validate and register a language folder's manifest (its language registered first).

    Raises:
        RegistrationError: see :func:`validate_template`; a manifest whose templates belong to
            another language.
    """
    with _lock:
        for t in manifest.templates:
            validate_template(t)
            if t.backend != manifest.name:
                raise RegistrationError(f"template {t.id} declares backend {t.backend!r} but is in {manifest.name}")
        for t in manifest.templates:
            _add(t)


def register_template(template: TemplateSpec) -> TemplateSpec:
    """Register one template from outside the package; it becomes a candidate for the problems
    its ``problem_support`` accepts on its language's targets, cached and built by
    ``tilewright aot`` like the package's own. Returns it. Registering the same object again
    does nothing.

    Raises:
        RegistrationError: see :func:`validate_template`.
    """
    ensure_registered()
    with _lock:
        validate_template(template)
        _add(template)
    return template


def unregister_template(template_id: str) -> TemplateSpec:
    """Remove a registered template (a kernel author reloading their module, a test cleaning
    up); returns it.

    Raises:
        KeyError: no such template.
    """
    ensure_registered()
    with _lock:
        t = get_template(template_id)
        del _TEMPLATES[template_id]
        _BY_LANGUAGE[t.backend].remove(t)
    return t


def unregister_language(name: str) -> Language:
    """Remove a language registered by :func:`register_language` (a kernel author reloading
    their module, a test cleaning up); returns it. Tuning workers started afterwards no longer
    receive it.

    Raises:
        KeyError: no language of that name.
        RegistrationError: templates of that language are still registered; unregister them
            first with :func:`unregister_template`.
    """
    ensure_registered()
    with _lock:
        left = [t.id for t in _BY_LANGUAGE.get(name, [])]
        if left:
            raise RegistrationError(f"language {name!r} still has templates {left}; "
                                    "unregister_template them first")
        lang = drop_language(name)
        _BY_LANGUAGE.pop(name, None)
        _SCANNED_LANGUAGES.discard(name)
    return lang


def _add(t: TemplateSpec) -> None:
    if _TEMPLATES.get(t.id) is t:
        return
    _TEMPLATES[t.id] = t
    _BY_LANGUAGE.setdefault(t.backend, []).append(t)


def _register_module(module: ModuleType) -> None:
    lang = getattr(module, "LANGUAGE", None)
    if lang is not None:
        _scanned_language(lang)
    manifest = getattr(module, "MANIFEST", None)
    if manifest is not None:
        _scanned_manifest(manifest)


def _scanned_language(lang: Language) -> None:
    register_language(lang)
    _SCANNED_LANGUAGES.add(lang.name)


def _scanned_manifest(manifest: BackendManifest) -> None:
    register(manifest)
    _SCANNED_TEMPLATES.update(t.id for t in manifest.templates)


def _register_object(obj: Any) -> None:
    """What an entry point names: a language, a manifest, a template, a module declaring
    LANGUAGE/MANIFEST, a list of those, or a function returning one of them."""
    if isinstance(obj, ModuleType):
        _register_module(obj)
    elif isinstance(obj, Language):
        _scanned_language(obj)
    elif isinstance(obj, BackendManifest):
        _scanned_manifest(obj)
    elif isinstance(obj, TemplateSpec):
        validate_template(obj)
        _add(obj)
        _SCANNED_TEMPLATES.add(obj.id)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _register_object(item)
    elif callable(obj) and not isinstance(obj, type):
        _register_object(obj())
    else:
        raise RegistrationError(f"an entry point gave {type(obj).__name__}: expected a Language, a "
                                "BackendManifest, a TemplateSpec, a module, a list or a function")


def _entry_points(group: str) -> list:
    try:
        return sorted(importlib.metadata.entry_points(group=group), key=lambda ep: ep.name)
    except Exception as e:  # noqa: BLE001 - broken package metadata must not break tilewright
        log.warning("cannot read the %s entry points: %s", group, e)
        return []


def registered_by_calls() -> list[bytes]:
    """The languages and templates this process registered by calling ``register_language`` /
    ``register_template`` (not found by scanning the folders and entry points), each pickled
    on its own, for another process: a tuning worker (spawned: it starts with only what a scan
    finds) replays them with :func:`replay`. One that cannot be pickled (a lambda among a
    language's hooks, a class defined inside a function) is left out with a warning: its
    candidates then fail in workers, with the reason."""
    import pickle

    with _lock:
        found = [lang for lang in languages() if lang.name not in _SCANNED_LANGUAGES]
        found += [t for t in _TEMPLATES.values() if t.id not in _SCANNED_TEMPLATES]
    out = []
    for obj in found:
        try:
            out.append(pickle.dumps(obj))
        except Exception as e:  # noqa: BLE001 - any pickling failure means the same
            name = getattr(obj, "id", None) or obj.name
            log.warning("%s cannot be sent to tuning workers (%s: %s); define it at module level "
                        "or register it through an entry point", name, type(e).__name__, e)
    return out


def replay(registrations: Iterable[bytes]) -> None:
    """Register what another process registered by calls (:func:`registered_by_calls`).

    Each registration is unpickled on its own: one whose module this process cannot import
    (the parent added a folder to ``sys.path`` and removed it again) is skipped with a warning,
    so only that language's or template's candidates fail here, never the whole worker."""
    import pickle

    ensure_registered()
    for blob in registrations:
        try:
            obj = pickle.loads(blob)
        except Exception as e:  # noqa: BLE001 - an unimportable module, a changed class: skip it
            log.warning("a language or template registered in the parent cannot be loaded in this "
                        "worker (%s: %s); its candidates fail here", type(e).__name__, e)
            continue
        if isinstance(obj, Language):
            register_language(obj, replace=True)
        else:
            with _lock:
                if obj.id in _TEMPLATES:
                    continue
                validate_template(obj)
                _add(obj)


def ensure_registered() -> None:
    """Register the package's language folders, then the installed entry points, then the
    modules ``config.templates`` (``TILEWRIGHT_TEMPLATES``) names (once).

    A plug-in whose entry point fails to load or validate is skipped with one warning naming
    it: someone else's broken package never stops tilewright."""
    global _discovered
    with _lock:
        if _discovered:
            return
        _discovered = True
        try:
            for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
                if info.ispkg:
                    _register_module(importlib.import_module(f"{__name__}.{info.name}"))
        except BaseException:
            _discovered = False  # a broken folder of ours is a bug: raise it every time
            raise
        _BUILTIN.update(_TEMPLATES)
        load_entry_points()
    from tilewright._config import config

    if config.templates:
        for spec, why in load_user_modules(config.templates.split(","), strict=False).items():
            log.warning("TILEWRIGHT_TEMPLATES: skipping %s: %s", spec, why)


_USER_MODULES: set[str] = set()


def load_user_modules(specs: Iterable[str], *, strict: bool = True) -> dict[str, str]:
    """Import the modules that register a user's templates and languages: each spec is a module
    name (``mypkg.kernels``) or a ``.py`` file (its folder goes on ``sys.path`` and it is
    imported by its name, so tuning workers can import it too); after the import a module's
    ``register()`` is called when it has one (the examples in docs/examples/ register that way),
    else its import is expected to register. Each spec is loaded once per process.

    Returns the specs that failed, each with its reason (``strict=False``).

    Raises:
        RegistrationError: ``strict`` and a spec cannot be found, imported or registered.
    """
    import os
    import sys

    failed = {}
    for spec in (s.strip() for s in specs):
        if not spec or spec in _USER_MODULES:
            continue
        try:
            if spec.endswith(".py") or os.sep in spec:
                path = os.path.abspath(spec)
                if not os.path.isfile(path):
                    raise FileNotFoundError(f"no file {path}")
                folder, name = os.path.split(path[:-3] if path.endswith(".py") else path)
                if folder not in sys.path:
                    sys.path.insert(0, folder)
                module = importlib.import_module(name)
            else:
                module = importlib.import_module(spec)
            if callable(getattr(module, "register", None)):
                module.register()
            _USER_MODULES.add(spec)
        except Exception as e:  # noqa: BLE001 - any way the user's module fails is reported the same
            why = f"{type(e).__name__}: {e}"
            if strict:
                raise RegistrationError(f"cannot load templates from {spec!r} ({why}); give an importable "
                                        "module name (mypkg.kernels) or a .py file") from e
            failed[spec] = why
    return failed


def is_builtin(template_id: str) -> bool:
    """Whether ``template_id`` is one of the package's own templates (not a plug-in's or a
    user's, registered by entry point, ``TILEWRIGHT_TEMPLATES`` or a call)."""
    ensure_registered()
    return template_id in _BUILTIN


def user_modules_loaded() -> list[str]:
    """The specs :func:`load_user_modules` loaded in this process."""
    return sorted(_USER_MODULES)


def load_entry_points() -> list[str]:
    """Register what the installed packages' ``tilewright.languages`` and ``tilewright.templates``
    entry points name (languages first: templates name them); returns the entry points skipped,
    each ``"name: why"``. A failing one is skipped with one warning naming it and its package."""
    skipped = []
    for group in (LANGUAGE_GROUP, TEMPLATE_GROUP):
        for ep in _entry_points(group):
            try:
                with _lock:
                    _register_object(ep.load())
            except Exception as e:  # noqa: BLE001 - someone else's broken plug-in
                dist = getattr(getattr(ep, "dist", None), "name", "?")
                log.warning("skipping entry point %s = %s (%s, package %s): %s: %s",
                            ep.name, ep.value, group, dist, type(e).__name__, e)
                skipped.append(f"{ep.name}: {type(e).__name__}: {e}")
    return skipped


def manifests() -> dict[str, BackendManifest]:
    """Every language with templates, in priority order, each with all its templates (those
    registered from outside the package included)."""
    ensure_registered()
    with _lock:
        return {lang.name: BackendManifest.of(lang, _BY_LANGUAGE[lang.name])
                for lang in languages() if _BY_LANGUAGE.get(lang.name)}


def all_templates() -> list[TemplateSpec]:
    return [t for m in manifests().values() for t in m.templates]


def get_template(template_id: str) -> TemplateSpec:
    """The registered template with this id.

    Raises:
        KeyError: no such template; the message lists the registered ids.
    """
    ensure_registered()
    try:
        return _TEMPLATES[template_id]
    except KeyError:
        raise KeyError(f"no template {template_id!r}; registered: {', '.join(_TEMPLATES)}") from None


def templates_for(op: str, target_backend: str | None = None, *, jit: bool = False) -> list[TemplateSpec]:
    """Templates implementing ``op`` whose language can run on ``target_backend``; with ``jit``
    only those a running model may launch: not the ``aot_only`` ones, and under
    ``config.force_backend=<language>[,<language>...]`` only those languages' and ATen's (so the
    forced languages' templates alone share the policy's candidate budget)."""
    from tilewright._config import config, forced_languages

    forced = forced_languages(config.force_backend) if jit else ()
    out = []
    for m in manifests().values():
        if target_backend is not None and target_backend not in m.target_backends:
            continue
        if forced and m.name not in forced + ("aten",):
            continue
        out.extend(t for t in m.templates if t.op == op and not (jit and t.aot_only))
    return out


__all__ = [
    "BackendManifest", "Knob", "Language", "ParamSpace", "RenderedKernel", "SUPPORTED", "Support",
    "TemplateSpec", "all_templates", "computes_epilogue", "ensure_registered", "get_template", "load_entry_points", "load_user_modules",
    "manifests",
    "powers_of_two", "register", "register_language",
    "register_template", "registered_by_calls", "replay", "templates_for", "unregister_language",
    "unregister_template",
    "validate_template",
]
