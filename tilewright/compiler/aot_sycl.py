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

import re
from pathlib import Path
from typing import Callable, Iterable

from tilewright.compiler.aot_written import Written, build_written, digest, plan_written
from tilewright.compiler.capture import CapturedKernel
from tilewright.kinds import kind_of
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
    ``pvc/reduction_8x128_<hash8>-sycl_reduction-wg128`` (the folder of its files): the problem
    part is its kind's (:meth:`~tilewright.kinds.ProblemKind.aot_label`)."""
    p = cap.problem
    if "THREAD_M" in params:  # a tiled kernel: the tile, and each work-item's sub-tile
        tile = "{BLOCK_M}x{BLOCK_N}x{BLOCK_K}t{THREAD_M}x{THREAD_N}".format(**params)
    else:  # a loop kernel: work-items per group
        tile = f"wg{params['WG']}"
    return f"{target.arch}/{kind_of(p).aot_label(p)}-{template.id.replace('.', '_')}-{tile}"


def plan_sycl(captured: Iterable[CapturedKernel], targets: Iterable[Target], *, per_template: int = 1):
    """The SYCL kernels to write for ``targets`` (those of the ``xpu`` backend): per problem and
    SYCL template, the best ``per_template`` settings by the cost model, rendered. Returns
    (kernels as :class:`~tilewright.compiler.aot.AotKernel`, refusals, each kernel's
    :class:`~tilewright.templates.base.RenderedKernel` by name)."""
    return plan_written(
        captured, targets, per_template=per_template, kernel_name=kernel_name,
        templates=lambda kind, t: [x for x in templates_for(kind, t.backend) if x.backend == "sycl"],
        none_reason=lambda kind: f"no SYCL template for {kind} kernels (they run on ATen on XPU)")


def build_sycl(kernels: list, rendered: dict[str, RenderedKernel], root: Path,
               on_result: Callable[[CompileResult], None] | None = None) -> None:
    """Write each kernel's source and launcher under ``root/<name>/``, build the source with the
    SYCL runtime and write its SPIR-V; sets each kernel's ``result``. An unchanged kernel
    already on disk is ``cached``."""
    from tilewright.runtime import sycl

    def key(k) -> str:
        w = sycl.wheels()
        return digest(cpp=sycl_source(rendered[k.name])[0], launcher=rendered[k.name].source,
                      sycl=w.version if not isinstance(w, str) else "none", options=list(sycl.BUILD_OPTIONS))

    def build(k, folder: Path) -> Written:
        r = rendered[k.name]
        cpp, entry = sycl_source(r)
        (folder / "kernel.cpp").write_text(cpp)
        (folder / "launcher.py").write_text(r.source)
        files = {"cpp": f"{k.name}/kernel.cpp", "py": f"{k.name}/launcher.py"}
        meta = {"kernel": entry, "build_options": list(sycl.BUILD_OPTIONS), "language": "sycl"}
        try:
            dev = sycl.device()
            images = _split_images(dev.binary(cpp, entry))
        except Exception as e:  # noqa: BLE001 - a kernel that does not build costs that kernel
            return Written("failed", files, meta, f"{type(e).__name__}: {e}")
        for i, image in enumerate(images):  # one file per device image (one, here)
            stem = "kernel" if len(images) == 1 else f"kernel.{i}"
            rel = f"{k.name}/{stem}.{'spv' if _is_spirv(image) else 'bin'}"
            (root / rel).write_bytes(image)
            files["spv" if len(images) == 1 else f"image{i}"] = rel
        meta |= {"device": dev.info.name, "device_backend": dev.info.backend, "images": len(images),
                 "spirv": all(_is_spirv(i) for i in images)}
        return Written("built", files, meta)

    build_written(kernels, root, key=key, build=build, on_result=on_result)


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
