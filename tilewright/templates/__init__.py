"""Kernel templates, one folder per backend, each folder with a short manifest.

``templates_for(op, target)`` lists the registered templates that can serve an op on a target;
``get_template(id)`` finds one by id. Manifests are validated when registered, so a template with
a broken id, parameter space or missing source fails at import, not at tuning time.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilewright.templates.base import (
    Knob, ParamSpace, RenderedKernel, Support, SUPPORTED, TemplateSpec, powers_of_two,
)


@dataclass(frozen=True)
class BackendManifest:
    """What one backend folder provides.

    Attributes:
        name: the folder name ("triton", "aten").
        description: one line for ``tilewright templates``.
        target_backends: target backends its kernels can run on ("cuda", "hip", "cpu", ...).
        templates: its template specs.
    """

    name: str
    description: str
    target_backends: tuple[str, ...]
    templates: tuple[TemplateSpec, ...]


_MANIFESTS: dict[str, BackendManifest] = {}
_TEMPLATES: dict[str, TemplateSpec] = {}


def register(manifest: BackendManifest) -> None:
    """Validate and register a backend's manifest.

    Raises:
        ValueError: a template whose id, backend, parameter space or jinja file is inconsistent,
            or an id registered twice.
    """
    for t in manifest.templates:
        if t.backend != manifest.name:
            raise ValueError(f"template {t.id} declares backend {t.backend!r} but is in {manifest.name}")
        if not t.id.startswith(manifest.name + "."):
            raise ValueError(f"template id {t.id!r} must start with '{manifest.name}.'")
        if t.id in _TEMPLATES and _TEMPLATES[t.id] is not t:
            raise ValueError(f"template id {t.id!r} registered twice")
        t.space.validate(t.space.default())
        if t.jinja and not (t.folder / t.jinja).is_file():
            raise ValueError(f"template {t.id}: missing source {t.folder / t.jinja}")
    _MANIFESTS[manifest.name] = manifest
    for t in manifest.templates:
        _TEMPLATES[t.id] = t


def _load_builtin() -> None:
    from tilewright.templates import aten, cutedsl, gluon, metal, triton

    for backend in (aten, triton, gluon, cutedsl, metal):
        register(backend.MANIFEST)
    from tilewright.templates import sycl  # renders without the SYCL runtime; refuses to run without it

    register(sycl.MANIFEST)
    from tilewright.templates import flydsl  # renders without flydsl; compiles need `make flydsl-setup`

    register(flydsl.MANIFEST)


def manifests() -> dict[str, BackendManifest]:
    if not _MANIFESTS:
        _load_builtin()
    return dict(_MANIFESTS)


def all_templates() -> list[TemplateSpec]:
    manifests()
    return list(_TEMPLATES.values())


def get_template(template_id: str) -> TemplateSpec:
    """The registered template with this id.

    Raises:
        KeyError: no such template; the message lists the registered ids.
    """
    manifests()
    try:
        return _TEMPLATES[template_id]
    except KeyError:
        raise KeyError(f"no template {template_id!r}; registered: {', '.join(_TEMPLATES)}") from None


def templates_for(op: str, target_backend: str | None = None, *, jit: bool = False) -> list[TemplateSpec]:
    """Templates implementing ``op`` whose backend can run on ``target_backend``; with ``jit``
    only those a running model can launch (not the ``aot_only`` ones)."""
    out = []
    for m in manifests().values():
        if target_backend is not None and target_backend not in m.target_backends:
            continue
        out.extend(t for t in m.templates if t.op == op and not (jit and t.aot_only))
    return out


__all__ = [
    "BackendManifest", "Knob", "ParamSpace", "RenderedKernel", "SUPPORTED", "Support",
    "TemplateSpec", "all_templates", "get_template", "manifests", "powers_of_two", "register",
    "templates_for",
]
