"""The SYCL runtime: kernels compiled from SYCL source at run time and launched on torch tensors.

The SYCL runtime comes from PyPI (the ``sycl`` extra: ``intel-sycl-rt``, ``intel-cmplr-lib-ur``,
``intel-opencl-rt``, all at :data:`WHEEL_VERSION`). A small C++ host shim of ours
(``sycl_shim.cpp`` beside this file) wraps what tilewright needs behind a C ABI: a queue on the
selected device, ``create_kernel_bundle_from_source(..., source_language::sycl, src)`` →
``build(build_options{"-fno-sycl-device-lib=all"})`` → ``ext_oneapi_get_kernel(name)`` →
``parallel_for(nd_range<1>)``. It is built with the system C++ compiler (``$CXX`` or ``g++``)
on first use into ``<config.cache_path>/sycl/shim-<hash>/`` (the hash covers the shim source,
the wheel version and where the wheel lives, since the library path is baked in), then loaded
with ctypes. Built kernel bundles are cached in-process per source hash (2-3.5 s a build
on 2 cores with the templates' trimmed includes; ~4 s with all of ``<sycl/sycl.hpp>``).

Devices. Without an Intel GPU the kernels run on the **OpenCL CPU device** of
``intel-opencl-rt``: before the SYCL runtime loads, ``OCL_ICD_FILENAMES`` is pointed at the
wheel's ``libintelocl.so`` (the wheel's own ``.icd`` file names a path that does not exist) and
``ONEAPI_DEVICE_SELECTOR=opencl:cpu`` is set, each unless the user set it. Where torch sees an
Intel GPU (``torch.xpu.is_available()``) no selector is set, so SYCL picks the GPU (Level
Zero); the launcher then still takes CPU tensors only (see :meth:`SyclKernel.launch`).

Memory. The OpenCL CPU device reports ``aspect::usm_system_allocations``: it reads and writes
ordinary host memory, so a CPU tensor's ``data_ptr()`` is handed to the kernel directly
(zero-copy, measured). A device without that aspect gets each tensor staged through a USM
shared allocation (copied in before the launch, outputs copied back after).

A missing piece (no wheels, no compiler, a shim that does not build) raises
:class:`SyclUnavailableError` with one line naming the fix.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.metadata
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from tilewright.errors import EnvironmentMismatchError, KernelCompileError
from tilewright.runtime.toolchain import NO_HOST_CXX, host_cxx

WHEEL_VERSION = "2025.3.2"
"""The version of the three wheels (DESIGN.md, measured): 2026.x ships Level Zero adapters
only, with no CPU device."""
DISTS = ("intel-sycl-rt", "intel-cmplr-lib-ur", "intel-opencl-rt")
INSTALL_HINT = "pip install 'tilewright[sycl]' (or `make setup`)"
BUILD_OPTIONS = ("-fno-sycl-device-lib=all",)
"""Kernel build options: no SYCL device libraries linked (the CPU device builds without them;
the math the emitter uses is the device's own builtins)."""
SHIM_SOURCE = Path(__file__).with_name("sycl_shim.cpp")
_ERR_LEN = 1 << 16


class SyclUnavailableError(EnvironmentMismatchError):
    """The SYCL backend cannot run here; the message names what to install."""


# -- what is installed (cheap: nothing is loaded) ----------------------------------------------
@dataclass(frozen=True)
class Wheels:
    """Where the SYCL wheels put their files (``<prefix>/include``, ``<prefix>/lib``)."""

    version: str
    include: Path
    lib: Path

    @property
    def opencl_cpu_icd(self) -> Path:
        return self.lib / "libintelocl.so"


@functools.cache
def wheels() -> Wheels | str:
    """The installed wheels, or why they are unusable (one line, with the fix)."""
    versions = {}
    for dist in DISTS:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return f"the SYCL backend needs {dist}=={WHEEL_VERSION}, which is not installed: {INSTALL_HINT}"
    wrong = {d: v for d, v in versions.items() if v != WHEEL_VERSION}
    if wrong:
        return (f"the SYCL backend needs {', '.join(DISTS)} at {WHEEL_VERSION} (found "
                f"{', '.join(f'{d} {v}' for d, v in wrong.items())}; 2026.x has no OpenCL CPU device): {INSTALL_HINT}")
    dist = importlib.metadata.distribution("intel-sycl-rt")
    header = next((f for f in dist.files or () if str(f).replace("\\", "/").endswith("include/sycl/sycl.hpp")), None)
    lib = next((f for f in dist.files or () if Path(str(f)).name == "libsycl.so"), None)
    if header is None or lib is None:
        return f"intel-sycl-rt {versions['intel-sycl-rt']} has no include/sycl/sycl.hpp or libsycl.so: reinstall it, {INSTALL_HINT}"
    include = Path(dist.locate_file(header)).resolve().parent.parent
    libdir = Path(dist.locate_file(lib)).resolve().parent
    w = Wheels(versions["intel-sycl-rt"], include, libdir)
    if not w.opencl_cpu_icd.exists():
        return f"intel-opencl-rt has no libintelocl.so beside libsycl.so ({libdir}): reinstall it, {INSTALL_HINT}"
    return w


def compiler() -> str | None:
    """The host C++ compiler the shim is built with: ``$CXX``, else ``g++``, else ``c++``."""
    return host_cxx()


def unavailable_reason() -> str | None:
    """Why the SYCL backend cannot run here (one line naming the fix), or None when the wheels
    and a compiler are present (the shim itself is built on first use)."""
    w = wheels()
    if isinstance(w, str):
        return w
    if compiler() is None:
        return f"the SYCL backend builds its host shim with a C++ compiler and {NO_HOST_CXX}"
    return None


def available() -> bool:
    return unavailable_reason() is None


# -- the shim ----------------------------------------------------------------------------------
def _set_environment(w: Wheels) -> None:
    """Point the OpenCL ICD loader at the wheel's CPU runtime and select the OpenCL CPU device,
    unless the user chose otherwise; must happen before libsycl loads (it reads both once)."""
    os.environ.setdefault("OCL_ICD_FILENAMES", str(w.opencl_cpu_icd))
    xpu = getattr(torch, "xpu", None)
    if "ONEAPI_DEVICE_SELECTOR" not in os.environ and not (xpu is not None and xpu.is_available()):
        os.environ["ONEAPI_DEVICE_SELECTOR"] = "opencl:cpu"


def shim_key(w: Wheels) -> str:
    h = hashlib.sha256(SHIM_SOURCE.read_bytes())
    h.update(f"{w.version}|{w.include}|{w.lib}|{sys.platform}".encode())
    return h.hexdigest()[:16]


def build_shim(w: Wheels, cache_root: Path) -> Path:
    """The shim's shared library, built once per key into ``cache_root/sycl/shim-<key>/``
    (under a file lock: processes that race build it once). ~7.5 s with g++ 12 -O2."""
    from filelock import FileLock

    folder = cache_root / "sycl" / f"shim-{shim_key(w)}"
    lib = folder / "libtw_sycl_shim.so"
    if lib.exists():
        return lib
    cxx = compiler()
    if cxx is None:
        raise SyclUnavailableError(unavailable_reason() or "no C++ compiler")
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / "build.lock")):
        if lib.exists():
            return lib
        tmp = folder / f"libtw_sycl_shim.{os.getpid()}.so"
        # -w: the SYCL headers warn about their own deprecated queries by the hundred
        cmd = [cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-w", f"-I{w.include}", str(SHIM_SOURCE),
               "-o", str(tmp), f"-L{w.lib}", "-lsycl", f"-Wl,-rpath,{w.lib}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            raise SyclUnavailableError(f"the SYCL host shim did not build ({' '.join(cmd[:2])} ...): "
                                       f"{' | '.join(tail)}")
        os.replace(tmp, lib)
    return lib


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    P, S, C, I = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_int
    sig = {
        "tw_sycl_create": (P, [C, S]),
        "tw_sycl_destroy": (None, [P]),
        "tw_sycl_device_info": (I, [P, C, S]),
        "tw_sycl_build": (P, [P, C, C, C, S]),
        "tw_sycl_free_bundle": (None, [P]),
        "tw_sycl_get_kernel": (P, [P, C, C, S]),
        "tw_sycl_free_kernel": (None, [P]),
        "tw_sycl_launch": (I, [P, P, I, C, ctypes.POINTER(P), ctypes.POINTER(ctypes.c_int64), S, S, C, S]),
        "tw_sycl_malloc_shared": (P, [P, S]),
        "tw_sycl_free": (None, [P, P]),
        "tw_sycl_bundle_binary": (ctypes.c_longlong, [P, ctypes.c_char_p, S, C, S]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


@dataclass(frozen=True)
class DeviceInfo:
    """What the selected SYCL device is. ``system_usm``: it reads host memory (zero-copy)."""

    name: str
    backend: str  # "opencl" | "level_zero" | "other"
    max_work_group_size: int
    system_usm: bool
    host_usm: bool
    local_mem_bytes: int


class SyclDevice:
    """One queue on the selected device, the kernels built for it, and launches.

    Use :func:`device` (one per process) rather than building this directly.
    """

    def __init__(self, lib_path: Path):
        self.lib = _bind(ctypes.CDLL(str(lib_path)))
        err = ctypes.create_string_buffer(_ERR_LEN)
        self.handle = self.lib.tw_sycl_create(err, _ERR_LEN)
        if not self.handle:
            raise SyclUnavailableError(
                f"no usable SYCL device ({err.value.decode(errors='replace')}; ONEAPI_DEVICE_SELECTOR="
                f"{os.environ.get('ONEAPI_DEVICE_SELECTOR', '')!r}): {INSTALL_HINT}")
        buf = ctypes.create_string_buffer(4096)
        if not self.lib.tw_sycl_device_info(self.handle, buf, 4096):
            raise SyclUnavailableError(f"the SYCL device does not describe itself: {buf.value.decode(errors='replace')}")
        name, backend, wg, sys_usm, host_usm, local = buf.value.decode(errors="replace").rsplit("|", 5)
        self.info = DeviceInfo(name, backend, int(wg), sys_usm == "1", host_usm == "1", int(local))
        self._kernels: dict[tuple[str, str], SyclKernel] = {}
        self._bundles: dict[str, int] = {}
        self._lock = threading.Lock()
        self.builds = 0  # bundles built in this process (tests check kernels are shared)
        self.build_seconds = 0.0

    def kernel(self, source: str, name: str) -> "SyclKernel":
        """Kernel ``name`` (an ``extern "C"`` free function) of ``source``, built once per
        source in this process.

        Raises:
            KernelCompileError: the source does not compile (the message holds the log).
        """
        digest = hashlib.sha256(source.encode()).hexdigest()
        key = (digest, name)
        with self._lock:
            k = self._kernels.get(key)
            if k is not None:
                return k
            bundle = self._bundles.get(digest)
            err = ctypes.create_string_buffer(_ERR_LEN)
            if bundle is None:
                import time

                t0 = time.perf_counter()
                bundle = self.lib.tw_sycl_build(self.handle, source.encode(), "\n".join(BUILD_OPTIONS).encode(),
                                                err, _ERR_LEN)
                if not bundle:
                    raise KernelCompileError(f"SYCL kernel {name} did not build: {err.value.decode(errors='replace')}")
                self.build_seconds += time.perf_counter() - t0
                self.builds += 1
                self._bundles[digest] = bundle
            handle = self.lib.tw_sycl_get_kernel(bundle, name.encode(), err, _ERR_LEN)
            if not handle:
                raise KernelCompileError(f"SYCL kernel {name} not found in its bundle: {err.value.decode(errors='replace')}")
            k = self._kernels[key] = SyclKernel(self, handle, name)
            return k


    def binary(self, source: str, name: str) -> bytes:
        """The device code the runtime built for ``source`` (kernel ``name`` built here first
        if it was not):
        each device image's backend content (on the OpenCL CPU device, the OpenCL program
        binary) preceded by its size as 8 little-endian bytes. For ``tilewright aot``.

        Raises:
            KernelCompileError: the source does not compile, or the runtime cannot hand out
                the image.
        """
        self.kernel(source, name)
        bundle = self._bundles[hashlib.sha256(source.encode()).hexdigest()]
        err = ctypes.create_string_buffer(4096)
        size = self.lib.tw_sycl_bundle_binary(bundle, None, 0, err, 4096)
        if size < 0:
            raise KernelCompileError(f"the SYCL runtime gave no binary for the built bundle: "
                                     f"{err.value.decode(errors='replace')}")
        buf = ctypes.create_string_buffer(max(size, 1))
        if self.lib.tw_sycl_bundle_binary(bundle, buf, size, err, 4096) != size:
            raise KernelCompileError(f"the SYCL bundle's binary changed size: {err.value.decode(errors='replace')}")
        return buf.raw[:size]


class SyclKernel:
    """One built kernel; :meth:`launch` runs it on torch CPU tensors."""

    def __init__(self, dev: SyclDevice, handle: int, name: str):
        self.dev, self.handle, self.name = dev, handle, name

    def launch(self, args: Sequence[torch.Tensor | int], global_size: int, local_size: int,
               stage: bool | None = None) -> None:
        """Run over ``global_size`` work-items (a multiple of ``local_size``) in work-groups of
        ``local_size``, and wait. ``args`` in the kernel's parameter order: tensors (passed as
        pointers to their first element) and Python ints (passed as int64).

        ``stage``: copy tensors through USM shared allocations (default: only when the device
        cannot read host memory). Tensors must be CPU tensors.

        Raises:
            InvalidInputError: a tensor that is not on the CPU.
            KernelCompileError: the launch failed (the runtime's message).
        """
        from tilewright.errors import InvalidInputError

        if stage is None:
            stage = not self.dev.info.system_usm
        n = len(args)
        kinds = bytearray(n)
        ptrs = (ctypes.c_void_p * n)()
        ints = (ctypes.c_int64 * n)()
        staged: list[tuple[int, torch.Tensor, int]] = []
        lib, h = self.dev.lib, self.dev.handle
        try:
            for i, a in enumerate(args):
                if isinstance(a, torch.Tensor):
                    if a.device.type != "cpu":
                        raise InvalidInputError(
                            f"SYCL kernel {self.name}: argument {i} is on {a.device}; the SYCL launcher takes CPU "
                            "tensors (on this host the xpu target runs on the OpenCL CPU device; sharing torch's "
                            "own xpu queue is not implemented)")
                    kinds[i] = ord("p")
                    ptr = a.data_ptr()
                    if stage and a.numel():
                        nbytes = _span_bytes(a)
                        usm = lib.tw_sycl_malloc_shared(h, nbytes)
                        if not usm:
                            raise KernelCompileError(f"SYCL kernel {self.name}: no USM shared allocation of {nbytes} bytes")
                        ctypes.memmove(usm, ptr, nbytes)
                        staged.append((usm, a, nbytes))
                        ptr = usm
                    ptrs[i] = ptr
                else:
                    kinds[i] = ord("i")
                    ints[i] = int(a)
            err = ctypes.create_string_buffer(4096)
            ok = lib.tw_sycl_launch(h, self.handle, n, bytes(kinds), ptrs, ints, global_size, local_size, err, 4096)
            if not ok:
                raise KernelCompileError(f"SYCL kernel {self.name} failed to launch "
                                         f"({global_size} work-items in groups of {local_size}): "
                                         f"{err.value.decode(errors='replace')}")
            for usm, a, nbytes in staged:  # copy everything back: outputs are among them
                ctypes.memmove(a.data_ptr(), usm, nbytes)
        finally:
            for usm, _, _ in staged:
                lib.tw_sycl_free(h, usm)


def _span_bytes(t: torch.Tensor) -> int:
    """Bytes from a tensor's first element to its last (strides included)."""
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()


_device: SyclDevice | None = None
_device_lock = threading.Lock()


def device() -> SyclDevice:
    """This process's SYCL device (the shim built and loaded on first call).

    Raises:
        SyclUnavailableError: wheels, compiler or device missing (the message names the fix).
    """
    global _device
    if _device is not None:
        return _device
    with _device_lock:
        if _device is None:
            w = wheels()
            if isinstance(w, str):
                raise SyclUnavailableError(w)
            if (why := unavailable_reason()) is not None:
                raise SyclUnavailableError(why)
            from tilewright._config import config

            lib = build_shim(w, config.cache_path)
            _set_environment(w)
            _device = SyclDevice(lib)
    return _device


def kernel(source: str, name: str) -> SyclKernel:
    """Kernel ``name`` of SYCL ``source`` on this process's device (built once per source)."""
    return device().kernel(source, name)


__all__ = ["BUILD_OPTIONS", "DISTS", "DeviceInfo", "INSTALL_HINT", "SyclDevice", "SyclKernel",
           "SyclUnavailableError", "WHEEL_VERSION", "available", "build_shim", "device", "kernel",
           "unavailable_reason", "wheels"]
