"""The language registry: one :class:`Language` object per kernel language (Triton, Gluon,
CuTeDSL, FlyDSL, Metal, SYCL, ATen, and any registered from outside the package).

A language says which target backends its kernels run on, whether its toolchain is usable here
(and, when not, why, in one line naming the fix), the toolchain versions that change what it
builds, how ``tilewright aot`` compiles its kernels, what ``config.force_backend=<name>`` means,
and how a rendered kernel becomes a launcher. Shared code looks languages up by name and never
lists them (the idea of Triton's ``triton.backends`` plug-ins and Helion's backend registry).

Where they come from: each folder under ``tilewright/templates/`` declares its language
(``LANGUAGE``) beside its templates (``MANIFEST``); code outside the package calls
:func:`register_language` or names one in the ``tilewright.languages`` entry-point group. The
folders are scanned the first time a language is looked up (:func:`_ensure_loaded` imports
``tilewright.templates`` by name: the runtime itself never imports a template).
"""

from __future__ import annotations

import importlib
import pickle
import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from tilewright.errors import RegistrationError
from tilewright.runtime.aot_writer import AotWriter

if TYPE_CHECKING:
    from pathlib import Path

    from tilewright.runtime.aot import CompileJob, CompileResult

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
# names that mean something else wherever a language name is accepted
RESERVED = ("auto",)


def _nothing_missing() -> str | None:
    return None


def _no_versions() -> dict[str, str]:
    return {}


def load_python_module(rendered: Any) -> Callable:
    """The default loader: import the rendered source as a Python module (under the Triton
    interpreter when ``rendered.interpret``) and return its ``rendered.entry`` function."""
    from tilewright.runtime.loader import load_module

    module = load_module(rendered.source, name=rendered.name, interpret=rendered.interpret)
    return getattr(module, rendered.entry)


@dataclass(frozen=True)
class Language:
    """One kernel language.

    Attributes:
        name: lower-case identifier; template ids start with ``<name>.`` and
            ``config.force_backend`` accepts it ("triton", "sycl").
        description: one line for ``tilewright templates``.
        target_backends: target backends its kernels run on ("cuda", "hip", "cpu", "mps", "xpu").
        forcing: what ``config.force_backend=<name>`` does, one sentence (docs/config.md).
        unavailable: ``() -> str | None``: why its toolchain cannot be used on this machine (a
            missing package or tool, with the fix), None when it can. Templates of a language
            that is unavailable are refused by ``TemplateSpec.supports`` with this reason;
            rendering does not need the toolchain.
        versions: ``() -> {package: version}``: the toolchain versions that change what its
            AOT compiler produces (part of every AOT job key; Triton's is always there).
        aot_compile: ``(CompileJob, root: Path) -> CompileResult``, run in a worker process by
            :func:`tilewright.runtime.aot.compile_jobs` for renderings whose ``AotSpec.language``
            is this name; a module-level function (it is pickled by reference to the worker).
            None: not built by the runtime's AOT driver (a language with an :attr:`aot_writer`
            writes its own; ATen has nothing to build).
        aot_writer: an :class:`~tilewright.runtime.aot_writer.AotWriter`, for a language whose
            kernels ``tilewright aot`` writes and checks itself instead of compiling them in
            workers (Metal, SYCL): targets of its :attr:`target_backends` go to it. None: the
            language has no such writer.
        load: ``(RenderedKernel) -> launcher``: how a rendered kernel becomes callable
            (default: import it as a Python module and take its entry function).
        priority: order among languages (lower first) wherever templates are listed: the
            candidate policies break ties in that order.
        prebuild: ``(RenderedKernel) -> None`` or None: build ahead what :attr:`load` would
            build (a native library, cached by its source's hash), safe to run in a background
            thread beside other candidates' prebuilds, so the autotuner overlaps those builds
            with its other work and :attr:`load` then finds them built. Raising is allowed (the
            error is met again, and reported, by :attr:`load`). None: nothing to build ahead.
        calls_aten: its kernels are calls of PyTorch operators (ATen's own "templates"), not
            kernels of their own: a launch report counts the ATen calls they make at run time
            in their place (:func:`tilewright.compiler.launches.launch_report`).
        pinned_knobs: target backend -> {knob: value} its compiler needs whatever the policy
            proposes (Triton's AMD stream pipeliner wants ``num_stages=2`` on "hip"); applied by
            the candidate policies to the knobs a template has.
    """

    name: str
    description: str
    target_backends: tuple[str, ...]
    forcing: str
    unavailable: Callable[[], str | None] = _nothing_missing
    versions: Callable[[], dict[str, str]] = _no_versions
    aot_compile: Callable[["CompileJob", "Path"], "CompileResult"] | None = None
    load: Callable[[Any], Callable] = load_python_module
    priority: int = 100
    prebuild: Callable[[Any], None] | None = None
    calls_aten: bool = False
    aot_writer: AotWriter | None = None
    # a plain dict: a language registered by a call is pickled for tuning workers, and a
    # MappingProxyType cannot be
    pinned_knobs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False)

    def pinned(self, backend: str) -> Mapping[str, Any]:
        """The knob values this language's compiler needs on target backend ``backend``."""
        return self.pinned_knobs.get(backend, {})

    def validate(self) -> None:
        """Raise :class:`RegistrationError` naming the first inconsistent field."""
        if not isinstance(self.name, str) or not _NAME.match(self.name) or self.name in RESERVED:
            raise RegistrationError(f"language name {self.name!r} must be a lower-case identifier "
                                    f"(letters, digits, _) other than {', '.join(RESERVED)}")
        if not self.description or not self.forcing:
            raise RegistrationError(f"language {self.name}: give a description and what forcing it means")
        if not self.target_backends or not all(isinstance(b, str) and b for b in self.target_backends):
            raise RegistrationError(f"language {self.name}: target_backends must name at least one "
                                    f"target backend (cuda, hip, cpu, mps, xpu), got {self.target_backends!r}")
        for hook in ("unavailable", "versions", "load"):
            if not callable(getattr(self, hook)):
                raise RegistrationError(f"language {self.name}: {hook} must be callable")
        if self.aot_writer is not None and not isinstance(self.aot_writer, AotWriter):
            raise RegistrationError(f"language {self.name}: aot_writer must be a tilewright AotWriter "
                                    f"(tilewright.runtime.aot_writer), got {type(self.aot_writer).__name__}")
        if not isinstance(self.pinned_knobs, Mapping) or not all(
                isinstance(v, Mapping) for v in self.pinned_knobs.values()):
            raise RegistrationError(f"language {self.name}: pinned_knobs must map a target backend "
                                    f"to {{knob: value}}, got {self.pinned_knobs!r}")
        if self.prebuild is not None and not callable(self.prebuild):
            raise RegistrationError(f"language {self.name}: prebuild must be callable or None")
        if self.aot_compile is not None:
            if not callable(self.aot_compile):
                raise RegistrationError(f"language {self.name}: aot_compile must be callable or None")
            try:
                pickle.dumps(self.aot_compile)
            except Exception as e:  # noqa: BLE001 - any pickling failure means the same thing
                raise RegistrationError(
                    f"language {self.name}: aot_compile {self.aot_compile!r} cannot be sent to a "
                    f"worker process ({type(e).__name__}); make it a module-level function") from None

    def check(self) -> str | None:
        """:attr:`unavailable`, with an exception from the check itself reported as the reason."""
        try:
            return self.unavailable()
        except Exception as e:  # noqa: BLE001 - a broken toolchain probe means unavailable
            return f"{self.name} availability check failed: {type(e).__name__}: {e}"


_lock = threading.RLock()
_LANGUAGES: dict[str, Language] = {}
_loaded = False


def register_language(language: Language, *, replace: bool = False) -> Language:
    """Validate and register a language; returns it.

    Args:
        language: the :class:`Language`.
        replace: allow replacing a registered language of the same name (tests, reloads).

    Raises:
        RegistrationError: an invalid field, or the name taken by another language.
    """
    if not isinstance(language, Language):
        raise RegistrationError(f"register_language takes a tilewright Language, got {type(language).__name__}")
    language.validate()
    with _lock:
        old = _LANGUAGES.get(language.name)
        if old is not None and old is not language and not replace:
            raise RegistrationError(f"a language named {language.name!r} is already registered "
                                    f"({old.description}); pick another name")
        _LANGUAGES[language.name] = language
    return language


def drop_language(name: str) -> Language:
    """Remove a language from this registry; returns it. Use
    :func:`tilewright.templates.unregister_language`, which first checks that none of its
    templates is left.

    Raises:
        KeyError: no language of that name.
    """
    with _lock:
        if name not in _LANGUAGES:
            raise KeyError(f"no language named {name!r}; registered: {sorted(_LANGUAGES)}")
        return _LANGUAGES.pop(name)


def _ensure_loaded() -> None:
    """Scan the template folders (and the entry points) once: they declare the languages."""
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        _loaded = True
    # by name: the runtime layer imports no template module; the folders register themselves
    importlib.import_module("tilewright.templates").ensure_registered()


def get_language(name: str) -> Language:
    """The registered language called ``name``.

    Raises:
        RegistrationError: no such language; the message lists the registered ones.
    """
    lang = _LANGUAGES.get(name)
    if lang is None:
        _ensure_loaded()
        lang = _LANGUAGES.get(name)
    if lang is None:
        raise RegistrationError(f"no language {name!r}; registered: {', '.join(language_names())}")
    return lang


def languages() -> list[Language]:
    """Every registered language, in :attr:`Language.priority` order."""
    _ensure_loaded()
    return sorted(_LANGUAGES.values(), key=lambda lang: (lang.priority, lang.name))


def pinned_knobs(language: str, backend: str) -> Mapping[str, Any]:
    """:meth:`Language.pinned` of the language called ``language`` on target backend
    ``backend``; nothing for a name no language is registered under (a test's template)."""
    lang = _LANGUAGES.get(language)
    if lang is None:
        _ensure_loaded()
        lang = _LANGUAGES.get(language)
    return lang.pinned(backend) if lang is not None else {}


def aot_writer_for(backend: str) -> Language | None:
    """The language whose :attr:`Language.aot_writer` writes kernels for targets of ``backend``
    ("mps", "xpu"), or None where ``tilewright aot`` compiles them in workers (or cannot)."""
    for lang in languages():
        if lang.aot_writer is not None and backend in lang.target_backends:
            return lang
    return None


def language_names() -> tuple[str, ...]:
    """The registered languages' names, in :attr:`Language.priority` order."""
    return tuple(lang.name for lang in languages())


def force_choices() -> tuple[str, ...]:
    """What ``config.force_backend`` accepts: "auto" and every registered language."""
    return ("auto", *language_names())
