"""``tilewright aot --target xpu``: the SYCL language's AOT writer (its kernels written and,
where the SYCL runtime is installed, built here).

For every target of the ``xpu`` backend (``xpu``, the Intel GPU the figures describe, and
``xpu:opencl-cpu``, this host's OpenCL CPU device), each GEMM and loop kernel the policy ranks
best (per SYCL template) is rendered by the shared driver (:mod:`tilewright.compiler.aot_written`);
this writer gives the folder ``kernels/<name>/`` the SYCL C++ source (``kernel.cpp``) and the
launcher module (``launcher.py``, which builds the same source at import time). With the
runtime present the source is also built by the SYCL runtime on the local device (the OpenCL
CPU device here) and the built bundle's device code is written as ``kernel.spv``: the runtime's
backend content (``ext_oneapi_get_backend_content``), which for the OpenCL backend is the SPIR-V
module the kernel compiler produced and the OpenCL runtime finalises to native code at load; it
is device-independent SPIR-V, not a native binary of the target chip (an Intel GPU would
finalise it with its own driver). A kernel's status is ``built`` (source written, compiled,
SPIR-V written), ``failed`` (the compiler's message), ``cached`` (an identical earlier build on
disk).

Without the SYCL runtime the SYCL templates refuse every problem (their ``supports`` needs the
runtime, as the JIT does), so the build records those refusals with the reason, which names
``pip install 'tilewright[sycl]'``, and writes no kernels.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tilewright.runtime.aot_writer import AotWriter, Written, digest

SPIRV_MAGIC = 0x07230203
_SOURCE = re.compile(r"^SOURCE = r'''(.*?)'''$", re.S | re.M)
_KERNEL = re.compile(r'^KERNEL = "(\w+)"$', re.M)


def sycl_source(rendered: Any) -> tuple[str, str]:
    """(SYCL C++ source, extern "C" kernel name) of a rendered SYCL module: its ``SOURCE`` and
    ``KERNEL`` constants (read from the text, so nothing is built).

    Raises:
        ValueError: the rendered module has no such constants.
    """
    src, name = _SOURCE.search(rendered.source), _KERNEL.search(rendered.source)
    if src is None or name is None:
        raise ValueError(f"{rendered.template_id}: the rendered module has no SOURCE/KERNEL constants")
    return src.group(1), name.group(1)


def tile(params: dict[str, Any]) -> str:
    """A SYCL kernel's parameters in its folder name: the tile and each work-item's sub-tile
    (``32x32x32t2x2``) for a GEMM, work-items per group (``wg128``) for a loop kernel."""
    if "THREAD_M" in params:
        return "{BLOCK_M}x{BLOCK_N}x{BLOCK_K}t{THREAD_M}x{THREAD_N}".format(**params)
    return f"wg{params['WG']}"


class SyclWriter(AotWriter):
    """Writes ``kernel.cpp`` and ``launcher.py`` per kernel, builds the source with the SYCL
    runtime and writes its SPIR-V. Folder names: ``pvc/mm_8x128x128_fp32_<hash6>-sycl_gemm-32x32x32t2x2``,
    ``pvc/reduction_8x128_<hash8>-sycl_reduction-wg128``."""

    def tile(self, params: dict[str, Any]) -> str:
        return tile(params)

    def describe(self, params: dict[str, Any]) -> str:
        """``wg128`` for a loop kernel (work-items per group); the tile and each work-item's
        sub-tile (``32x32x32 t2x2``) for a GEMM."""
        if "THREAD_M" in params:
            return "{BLOCK_M}x{BLOCK_N}x{BLOCK_K} t{THREAD_M}x{THREAD_N}".format(**params)
        return f"wg{params['WG']}"

    def none_reason(self, kind: str) -> str:
        return f"no SYCL template for {kind} kernels (they run on ATen on XPU)"

    def key(self, name: str, rendered: Any) -> str:
        from tilewright.templates.sycl import runtime as sycl

        w = sycl.wheels()
        return digest(cpp=sycl_source(rendered)[0], launcher=rendered.source,
                      sycl=w.version if not isinstance(w, str) else "none", options=list(sycl.BUILD_OPTIONS))

    def write(self, name: str, rendered: Any, root: Path) -> Written:
        from tilewright.templates.sycl import runtime as sycl

        folder = root / name
        cpp, entry = sycl_source(rendered)
        (folder / "kernel.cpp").write_text(cpp)
        (folder / "launcher.py").write_text(rendered.source)
        files = {"cpp": f"{name}/kernel.cpp", "py": f"{name}/launcher.py"}
        meta = {"kernel": entry, "build_options": list(sycl.BUILD_OPTIONS), "language": "sycl"}
        try:
            dev = sycl.device()
            images = split_images(dev.binary(cpp, entry))
        except Exception as e:  # noqa: BLE001 - a kernel that does not build costs that kernel
            return Written("failed", files, meta, f"{type(e).__name__}: {e}")
        for i, image in enumerate(images):  # one file per device image (one, here)
            stem = "kernel" if len(images) == 1 else f"kernel.{i}"
            rel = f"{name}/{stem}.{'spv' if is_spirv(image) else 'bin'}"
            (root / rel).write_bytes(image)
            files["spv" if len(images) == 1 else f"image{i}"] = rel
        meta |= {"device": dev.info.name, "device_backend": dev.info.backend, "images": len(images),
                 "spirv": all(is_spirv(i) for i in images)}
        return Written("built", files, meta)


def split_images(blob: bytes) -> list[bytes]:
    """The device images of :meth:`~tilewright.templates.sycl.runtime.SyclDevice.binary`'s output (each
    preceded by its size, 8 bytes little-endian).

    Raises:
        ValueError: the bundle holds no image.
    """
    images, at = [], 0
    while at < len(blob):
        n = int.from_bytes(blob[at:at + 8], "little")
        images.append(blob[at + 8:at + 8 + n])
        at += 8 + n
    if not images:
        raise ValueError("the SYCL runtime's bundle holds no device image")
    return images


def is_spirv(image: bytes) -> bool:
    """Whether a device image starts with the SPIR-V magic number."""
    return len(image) >= 4 and int.from_bytes(image[:4], "little") == SPIRV_MAGIC


WRITER = SyclWriter()
