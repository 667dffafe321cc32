"""``tilewright aot --target xpu``: a model's SYCL kernels, written and, where the SYCL runtime
is installed, built here.

For every target of the ``xpu`` backend (``xpu``, the Intel GPU the figures describe, and
``xpu:opencl-cpu``, this host's OpenCL CPU device), each GEMM and loop kernel the policy ranks
best (per SYCL template) is rendered; the folder ``kernels/<name>/`` gets the SYCL C++ source
(``kernel.cpp``) and the launcher module (``launcher.py``, which builds the same source at
import time). With the runtime present the source is also built by the SYCL runtime on the
local device (the OpenCL CPU device here) and the built bundle's device code is written as
``kernel.spv``: the runtime's backend content (``ext_oneapi_get_backend_content``), which for
the OpenCL backend is the SPIR-V module the kernel compiler produced and the OpenCL runtime
finalises to native code at load; it is device-independent SPIR-V, not a native binary of the
target chip (an Intel GPU would finalise it with its own driver). A kernel's status is
``built`` (source written, compiled, SPIR-V written), ``failed`` (the compiler's message),
``cached`` (an identical earlier build on disk).

Without the SYCL runtime the SYCL templates refuse every problem (their ``supports`` needs the
runtime, as the JIT does), so the build records those refusals with the reason, which names
``pip install 'tilewright[sycl]'``, and writes no kernels.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Callable, Iterable

from tilewright.autotune.cost_model import estimate_gemm, estimate_loop
from tilewright.autotune.kinds import kind_name
from tilewright.autotune.policy import policy_for
from tilewright.compiler.capture import CapturedKernel
from tilewright.problem import GemmProblem
from tilewright.runtime.aot import CompileResult
from tilewright.runtime.targets import Target
from tilewright.templates import TemplateSpec, templates_for
from tilewright.templates.base import RenderedKernel

SPIRV_MAGIC = 0x07230203
_SOURCE = re.compile(r"^SOURCE = r'''(.*?)'''$", re.S | re.M)
_KERNEL = re.compile(r'^KERNEL = "(\w+)"$', re.M)


def sycl_source(rendered: RenderedKernel) -> tuple[str, str]:
    """(SYCL C++ source, extern "C" kernel name) of a rendered SYCL module: its ``SOURCE`` and
    ``KERNEL`` constants (read from the text, so nothing is built)."""
    src, name = _SOURCE.search(rendered.source), _KERNEL.search(rendered.source)
    if src is None or name is None:
        raise ValueError(f"{rendered.template_id}: the rendered module has no SOURCE/KERNEL constants")
    return src.group(1), name.group(1)


def kernel_name(target: Target, cap: CapturedKernel, template: TemplateSpec, params: dict) -> str:
    """``pvc/mm_8x128x128_fp32_<hash6>-sycl_gemm-32x32x32t2x2`` or
    ``pvc/reduction_8x128_<hash8>-sycl_reduction-wg128`` (the folder of its files)."""
    p = cap.problem
    if isinstance(p, GemmProblem):
        tile = "{BLOCK_M}x{BLOCK_N}x{BLOCK_K}t{THREAD_M}x{THREAD_N}".format(**params)
        return f"{target.arch}/{p.op}_{p.M}x{p.N}x{p.K}_{p.dtype}_{p.stable_hash()[:6]}-sycl_gemm-{tile}"
    numel = f"{p.xnumel}x{p.rnumel}" if p.kind == "reduction" else f"{p.xnumel}"
    return f"{target.arch}/{p.kind}_{numel}_{p.stable_hash()[:8]}-{template.id.replace('.', '_')}-wg{params['WG']}"


def plan_sycl(captured: Iterable[CapturedKernel], targets: Iterable[Target], *, per_template: int = 1):
    """The SYCL kernels to write for ``targets`` (those of the ``xpu`` backend): per problem and
    SYCL template, the best ``per_template`` settings by the cost model, rendered. Returns
    (kernels as :class:`~tilewright.compiler.aot.AotKernel`, refusals, each kernel's
    :class:`~tilewright.templates.base.RenderedKernel` by name)."""
    from tilewright.compiler.aot import AotKernel  # aot imports this module

    kernels, refused, rendered = [], [], {}
    captured = list(captured)
    for target in targets:
        for cap in captured:
            kind = kind_name(cap.problem)
            for template in [t for t in templates_for(kind, target.backend) if t.backend == "sycl"]:
                support = template.supports(cap.problem, target)
                if not support:
                    refused.append({"target": target.name, "template": template.id,
                                    "problem": cap.problem.describe(), "reason": support.reason})
                    continue
                ranked = policy_for(kind, target).ranked(cap.problem, target, template)
                if not ranked:
                    refused.append({"target": target.name, "template": template.id,
                                    "problem": cap.problem.describe(),
                                    "reason": "no parameter setting is legal on this target"})
                for ms, params in ranked[:per_template]:
                    est = (estimate_gemm(cap.problem, params, target, efficiency=template.efficiency(target))
                           if kind == "gemm" else estimate_loop(cap.problem, params, target))
                    k = AotKernel(kernel_name(target, cap, template, params), target, cap, template,
                                  dict(params), ms, est.bound)
                    if k.name in rendered:  # the same kernel used twice (two layers): built once
                        continue
                    rendered[k.name] = template.render(cap.problem, params, target)
                    kernels.append(k)
    return kernels, refused, rendered


def _build_key(cpp: str, launcher: str) -> str:
    from tilewright.runtime import sycl

    w = sycl.wheels()
    version = w.version if not isinstance(w, str) else "none"
    return hashlib.sha256(json.dumps({"cpp": cpp, "launcher": launcher, "sycl": version,
                                      "options": list(sycl.BUILD_OPTIONS)}).encode()).hexdigest()


def build_sycl(kernels: list, rendered: dict[str, RenderedKernel], root: Path,
               on_result: Callable[[CompileResult], None] | None = None) -> None:
    """Write each kernel's source and launcher under ``root/<name>/``, build the source with the
    SYCL runtime and write its SPIR-V; sets each kernel's ``result``. An unchanged kernel
    already on disk is ``cached``."""
    from tilewright.runtime import sycl

    for k in kernels:
        r = rendered[k.name]
        cpp, entry = sycl_source(r)
        key = _build_key(cpp, r.source)
        folder = root / k.name
        files = {"cpp": f"{k.name}/kernel.cpp", "py": f"{k.name}/launcher.py"}
        record = folder / "job.json"
        result = None
        if record.is_file():
            try:
                old = CompileResult(**json.loads(record.read_text()))
            except (ValueError, TypeError):
                old = None
            if old is not None and old.key == key and old.ok and all((root / f).is_file() for f in old.artifacts.values()):
                result = CompileResult(k.name, key, "cached", old.seconds, old.artifacts, old.hashes, old.metadata)
        if result is None:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "kernel.cpp").write_text(cpp)
            (folder / "launcher.py").write_text(r.source)
            start = time.perf_counter()
            meta = {"kernel": entry, "build_options": list(sycl.BUILD_OPTIONS), "language": "sycl"}
            try:
                dev = sycl.device()
                blob = dev.binary(cpp, entry)
                images = _split_images(blob)
                for i, image in enumerate(images):  # one file per device image (one, here)
                    stem = "kernel" if len(images) == 1 else f"kernel.{i}"
                    rel = f"{k.name}/{stem}.{'spv' if _is_spirv(image) else 'bin'}"
                    (root / rel).write_bytes(image)
                    files["spv" if len(images) == 1 else f"image{i}"] = rel
                meta |= {"device": dev.info.name, "device_backend": dev.info.backend, "images": len(images),
                         "spirv": all(_is_spirv(i) for i in images)}
                status, error = "built", ""
            except Exception as e:  # noqa: BLE001 - a kernel that does not build costs that kernel
                status, error = "failed", f"{type(e).__name__}: {e}"
            hashes = {stage: hashlib.sha256((root / rel).read_bytes()).hexdigest() for stage, rel in files.items()}
            result = CompileResult(k.name, key, status, time.perf_counter() - start, files, hashes, meta, error)
            if result.ok:
                record.write_text(json.dumps(result.to_json(), indent=1))
        k.result = result
        if on_result:
            on_result(result)


def _split_images(blob: bytes) -> list[bytes]:
    """The device images of :meth:`~tilewright.runtime.sycl.SyclDevice.binary`'s output (each
    preceded by its size, 8 bytes little-endian)."""
    images, at = [], 0
    while at < len(blob):
        n = int.from_bytes(blob[at:at + 8], "little")
        images.append(blob[at + 8:at + 8 + n])
        at += 8 + n
    if not images:
        raise ValueError("the SYCL runtime's bundle holds no device image")
    return images


def _is_spirv(image: bytes) -> bool:
    return len(image) >= 4 and int.from_bytes(image[:4], "little") == SPIRV_MAGIC
