"""The AOT-writer hook of a language whose kernels ``tilewright aot`` writes and checks itself
rather than compiling them with :func:`tilewright.runtime.aot.compile_jobs` in worker processes
(Metal: a host syntax check, no compiler off macOS; SYCL: the SYCL runtime's compile to
SPIR-V).

A language sets :attr:`tilewright.runtime.languages.Language.aot_writer` to an
:class:`AotWriter`; its folder holds the subclass (``templates/<lang>/aot.py``). The shared
driver (:mod:`tilewright.compiler.aot_written`) plans every kernel with the problem kind's
policy and cost model, renders it, and asks the writer only what differs between languages: how
a kernel's folder is named, why a problem has no template, the build key, and what writing and
building one kernel means. Targets are routed to a writer by backend: a target whose backend is
among the writer's language's ``target_backends`` is written by it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Written:
    """What building one written kernel gave: status "built" or "failed", the compiler's
    message, the artifacts (stage -> path relative to the output folder; every one is
    hashed) and metadata for the manifest."""

    status: str
    files: dict[str, str]
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str = ""


def digest(**facts: Any) -> str:
    """sha256 of ``facts`` as sorted JSON: a written kernel's build key."""
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


class AotWriter:
    """How one language's kernels are written ahead of time. Subclasses override every method
    that raises here; the defaults fit a language whose folder names are its template ids.

    ``rendered`` arguments are :class:`~tilewright.templates.base.RenderedKernel` objects (the
    runtime layer does not import templates, so they are typed loosely here).
    """

    def template_folder(self, template_id: str) -> str:
        """The template's part of a kernel's folder name: ``"metal.gemm"`` -> ``"metal_gemm"``."""
        return template_id.replace(".", "_")

    def tile(self, params: dict[str, Any]) -> str:
        """The parameters' part of a kernel's folder name (``"32x32x16w4"``, ``"wg128"``)."""
        raise NotImplementedError(f"{type(self).__name__} must say how its tiles are named")

    def describe(self, params: dict[str, Any]) -> str | None:
        """The parameters in a few characters for ``tilewright aot``'s table, where the
        language's knobs are not the shared ones (BLOCK_M/N/K, XBLOCK, RBLOCK, num_warps, ...);
        None: the shared description (:func:`tilewright.compiler.aot.describe_params`) fits."""
        return None

    def kernel_folder(self, template_id: str, params: dict[str, Any]) -> str:
        """What follows the problem's label in a kernel's folder name: template, then tile."""
        return f"{self.template_folder(template_id)}-{self.tile(params)}"

    def none_reason(self, kind: str) -> str:
        """The refusal recorded for a problem of ``kind`` that none of the language's templates
        serves (it runs on ATen on that target)."""
        return f"no template of this language for {kind} kernels (they run on ATen there)"

    def key(self, name: str, rendered: Any) -> str:
        """The build key of kernel ``name``: an earlier build with the same key is reused
        (status ``cached``). Include every input the written files and the build depend on."""
        raise NotImplementedError(f"{type(self).__name__} must give a build key")

    def write(self, name: str, rendered: Any, root: Path) -> Written:
        """Write kernel ``name``'s files under ``root / name`` (the folder exists) and check or
        build them. A failure is returned as ``Written("failed", ...)`` with the message, never
        raised: it costs that kernel only. Artifact paths are relative to ``root``."""
        raise NotImplementedError(f"{type(self).__name__} must write its kernels")
