"""The C++ compile driver of the ``cpu`` target: generated kernel source → a shared library built
once with the host compiler, cached by hash, loaded and called with a low per-call cost.

**Build.** ``$CXX`` (else ``g++``, else ``c++``) with :data:`FLAGS`: ``-O3 -march=native
-fopenmp``, and never ``-ffast-math``: NaN, infinities and signed zeros behave as torch's. The
flags that are used instead are each value-preserving: ``-fno-math-errno`` (math calls set no
``errno``, so they can be vectorised), ``-fno-trapping-math`` (no FP exceptions are observed)
and ``-ffp-contract=off`` (no fused multiply-add where the source has a multiply and an add, so
each op rounds as eager's does); ``-fno-builtin-sinf`` and the like for the transcendental
functions (:data:`NOT_BUILTIN`: g++ rewrites ``sin(atan(x))`` without ``-ffast-math``). Where glibc's vector math library (libmvec) links, the kernels
declare its SIMD variants (``-DTW_LIBMVEC=1``, ``-lmvec``): a loop calling ``expf`` then calls
``_ZGVdN8v_expf`` on 8 lanes at a time (glibc documents them within 4 ulp, special values
included). A one-time probe per toolchain decides it.

**Cache.** ``<config.cache_path>/cpp/<key[:2]>/<name>_<key>.so``, ``key`` = hash of the source,
the compiler's version, the flags and the host CPU (``-march=native`` code is only valid on the
CPU it was built for). Each library has a ``.sha256`` beside it, written after the library is
in place: a library whose bytes do not match it (truncated, half-copied, edited) is rebuilt,
never loaded. Builds hold a file lock per library and write through a temporary file and a
rename, so two processes building the same kernel build it once and neither reads half a file.
An unwritable cache folder costs the reuse across processes (one warning, then a private
temporary folder), never the kernel.

**Launch.** A kernel's ABI is ``int64_t fn(const int64_t *args)``. The launcher
(:func:`launcher`) is a tiny CPython extension of ours (``launch.c``, built once per Python and
compiler) whose ``call(address, *ints)`` packs the integers and calls the kernel with the GIL
released; ~0.5 µs for 20 arguments, against ~5 µs for ctypes with ``argtypes`` (measured,
2 cores). Without Python's headers it falls back to ctypes (one int64 array per call).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import platform
import subprocess
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from tilewright._config import config
from tilewright.errors import EnvironmentMismatchError, KernelCompileError
from tilewright.runtime.status import ERR_MESSAGES, raise_status  # noqa: F401 - the launchers' statuses
from tilewright.runtime.toolchain import NO_HOST_CXX, host_cxx

log = logging.getLogger("tilewright.runtime")

try:  # the allocator entry Inductor's CPU wrappers call: ~0.5 us a tensor against ~1.1 us for
    # torch.empty_strided's Python binding (measured, one thread); the launchers allocate their
    # outputs on every call, so this is a graph's allocation cost
    from torch._C._dynamo.guards import _empty_strided_cpu as _fast_empty
except ImportError:  # not in this torch: the public call
    _fast_empty = None


def empty_strided(size: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor of ``size`` and ``stride`` (elements) and ``dtype``: what
    ``torch.empty_strided(size, stride, dtype=dtype)`` makes, through Inductor's faster entry
    where this torch has it. That entry skips the NaN fill of
    ``torch.utils.deterministic.fill_uninitialized_memory`` under deterministic algorithms (as
    Inductor's wrappers do): only for outputs a kernel writes in full."""
    return torch.empty_strided(size, stride, dtype=dtype)


if _fast_empty is not None:
    empty_strided = _fast_empty  # noqa: F811 - the same contract, one Python call less

# libm functions g++ must not treat as builtins: as builtins, g++ rewrites compositions of them
# without -ffast-math (g++ 12: sin(atan(x)) -> x / sqrt(x*x + 1), else copysign(1, x), which is
# +-1 for a NaN input where eager gives NaN); as plain calls they are still vectorised through
# their ``omp declare simd`` (libmvec) variants. floor, sqrt, fabs and the like stay builtins:
# they are single instructions and g++ folds nothing inexact through them.
NOT_BUILTIN = ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos",
               "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "pow", "atan2", "cbrt",
               "hypot")
FLAGS = ("-std=c++17", "-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math",
         "-ffp-contract=off", "-fPIC", "-shared", "-w") + tuple(
    f"-fno-builtin-{name}{suffix}" for name in NOT_BUILTIN for suffix in ("f", ""))
"""Compiler flags of every kernel (see the module docstring for why each value-changing flag is
absent)."""
BUILD_TIMEOUT_S = 600
LAUNCH_SOURCE = Path(__file__).with_name("launch.c")

# glibc's libmvec (x86_64): (level, the functions with SIMD variants, with their operand count):
# level 1 since glibc 2.22, level 2 added in 2.35. Kernels see the level as TW_LIBMVEC.
MVEC = ((1, (("exp", 1), ("log", 1), ("sin", 1), ("cos", 1), ("pow", 2))),
        (2, (("acos", 1), ("asin", 1), ("atan", 1), ("atan2", 2), ("cosh", 1), ("erf", 1), ("exp2", 1),
             ("expm1", 1), ("log10", 1), ("log1p", 1), ("log2", 1), ("sinh", 1), ("tan", 1), ("tanh", 1))))


class CppUnavailableError(EnvironmentMismatchError):
    """No C++ compiler: the message names what to install."""


def compiler() -> str | None:
    """The host C++ compiler: ``$CXX``, else ``g++``, else ``c++``."""
    return host_cxx()


def unavailable_reason() -> str | None:
    """Why C++ kernels cannot be built here (one line naming the fix), or None."""
    if compiler() is None:
        return f"the cpp templates build their kernels with a C++ compiler and {NO_HOST_CXX}"
    return None


def available() -> bool:
    return unavailable_reason() is None


# -- the toolchain ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Toolchain:
    """The compiler, its version, the flags every kernel is built with and the cache key part
    they make together with the host CPU."""

    cxx: str
    version: str
    flags: tuple[str, ...]
    libs: tuple[str, ...]
    key: str

    @property
    def libmvec(self) -> int:
        """The libmvec level the kernels are built with (0: none)."""
        return next((int(f.split("=")[1]) for f in self.flags if f.startswith("-DTW_LIBMVEC=")), 0)


def _host_cpu() -> str:
    """What ``-march=native`` depends on: the CPU's model and feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        keep = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features", "CPU part"))]
        return "\n".join(dict.fromkeys(keep))
    except OSError:
        return f"{platform.machine()}|{platform.processor()}"


def _glibc() -> tuple[int, int] | None:
    try:
        name, ver = os.confstr("CS_GNU_LIBC_VERSION").split()  # type: ignore[union-attr]
        major, minor = ver.split(".")[:2]
        return (int(major), int(minor)) if name == "glibc" else None
    except (AttributeError, ValueError, OSError):
        return None


def _vector_width_flags() -> tuple[str, ...]:
    """512-bit vectors where the CPU has AVX-512: g++ prefers 256-bit ones by default (older
    Xeons slowed their clock for 512-bit code), but loops calling libmvec make half the calls
    with them (softmax rows 1.4x faster, measured on a Xeon with AVX-512)."""
    return ("-mprefer-vector-width=512",) if " avx512f" in _host_cpu() else ()


def mvec_level(glibc: tuple[int, int] | None = None) -> int:
    """The libmvec level (:data:`MVEC`) this host's glibc should have: 0 where none (not
    x86_64, not glibc, or older than 2.22)."""
    g = _glibc() if glibc is None else glibc
    if platform.machine() not in ("x86_64", "AMD64") or g is None or g < (2, 22):
        return 0
    return 2 if g >= (2, 35) else 1


def _probe_libmvec(cxx: str, level: int) -> bool:
    """Whether a loop calling every function of ``level`` declared SIMD links against libmvec
    with nothing left undefined (one small build)."""
    decls, calls = [], []
    for lv, group in MVEC:
        for name, arity in group if lv <= level else ():
            for t, suffix in (("float", "f"), ("double", "")):
                decls.append(f"#pragma omp declare simd notinbranch\n{t} {name}{suffix}({', '.join([t] * arity)});")
                calls.append(f"  for (int64_t i = 0; i < n; ++i) {t[0]}[i] = {name}{suffix}({', '.join([t[0] + '[i]'] * arity)});")
    src = ('#include <cstdint>\nextern "C" {\n' + "\n".join(decls) + '\n}\n'
           'extern "C" void probe(float *f, double *d, int64_t n) {\n#pragma omp simd\n'
           + "\n#pragma omp simd\n".join(calls) + "\n}\n")
    with tempfile.TemporaryDirectory(prefix="tw-cpp-probe-") as d:
        path = Path(d) / "probe.cpp"
        path.write_text(src)
        proc = subprocess.run([cxx, *FLAGS, str(path), "-o", str(Path(d) / "probe.so"), "-lmvec",
                               "-Wl,--no-undefined"], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        return proc.returncode == 0


_toolchain_lock = threading.Lock()
_toolchain: list[Toolchain] = []


def toolchain() -> Toolchain:
    """The toolchain of this process (probed once; a thread that asks while another probes
    waits for its answer).

    Raises:
        CppUnavailableError: no C++ compiler.
    """
    if not _toolchain:
        with _toolchain_lock:
            if not _toolchain:
                _toolchain.append(_probe_toolchain())
    return _toolchain[0]


def _probe_toolchain() -> Toolchain:
    cxx = compiler()
    if cxx is None:
        raise CppUnavailableError(unavailable_reason() or "no C++ compiler")
    proc = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
    version = (proc.stdout or proc.stderr).strip().splitlines()[0] if proc.returncode == 0 else "unknown"
    base = hashlib.sha256(f"{cxx}|{version}|{' '.join(FLAGS)}|{_host_cpu()}".encode()).hexdigest()
    # the probe's answer is remembered beside the kernels (it costs one build)
    marker = _cache_root() / f"toolchain-{base[:16]}.mvec"
    try:
        level = int(marker.read_text().strip())
    except (OSError, ValueError):
        level = mvec_level()
        while level and not _probe_libmvec(cxx, level):
            level -= 1
        try:
            _atomic_write(marker, str(level))
        except OSError:
            pass
    flags = FLAGS + ((f"-DTW_LIBMVEC={level}",) if level else ()) + _vector_width_flags()
    libs = ("-lmvec",) if level else ()
    key = hashlib.sha256(f"{base}|{' '.join(flags + libs)}".encode()).hexdigest()[:16]
    return Toolchain(cxx, version, flags, libs, key)


# -- the cache -------------------------------------------------------------------------------
_fallback_roots: dict[Path, Path] = {}
_lock = threading.RLock()


def _cache_root() -> Path:
    """``<cache_dir>/cpp``, or this process's private folder when that cannot be written."""
    root = config.cache_path / "cpp"
    if root in _fallback_roots:
        return _fallback_roots[root]
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".write-{os.getpid()}-{threading.get_ident()}"
        probe.write_text("")
        probe.unlink()
        return root
    except OSError as e:
        private = _fallback_roots[root] = Path(tempfile.mkdtemp(prefix="tilewright-cpp-"))
        log.warning("cannot write C++ kernels under %s (%s: %s); using %s for this process "
                    "(set TILEWRIGHT_CACHE_DIR to a writable folder)", root, type(e).__name__,
                    e.strerror or e, private)
        return private


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}_{threading.get_ident()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _digest_file(lib: Path) -> Path:
    return lib.with_name(lib.name + ".sha256")


def is_valid(lib: Path) -> bool:
    """Whether ``lib`` is a complete build: its bytes hash to the digest written after it."""
    try:
        want = _digest_file(lib).read_text().strip()
        return hashlib.sha256(lib.read_bytes()).hexdigest() == want
    except OSError:
        return False


def library_path(source: str, name: str) -> Path:
    """Where the library of ``source`` lives in the cache (built or not)."""
    tc = toolchain()
    key = hashlib.sha256(f"{source}\0{tc.key}".encode()).hexdigest()[:20]
    return _cache_root() / key[:2] / f"{name}_{key}.so"


stats = {"builds": 0, "build_seconds": 0.0, "reused": 0}
"""Builds and reuses in this process (tests check that a second process reuses the library)."""


def build(source: str, name: str) -> Path:
    """The shared library of ``source``, built unless a valid one is cached.

    Raises:
        CppUnavailableError: no C++ compiler.
        KernelCompileError: the source does not compile (the message holds the compiler's last
            lines and the path of the source).
    """
    lib = library_path(source, name)
    if is_valid(lib):
        stats["reused"] += 1
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock

    with FileLock(str(lib) + ".lock"):
        if is_valid(lib):
            stats["reused"] += 1
            return lib
        if lib.exists():
            log.warning("cached C++ kernel %s does not match its digest (partial or corrupted); rebuilding", lib)
        _compile(source, lib)
    return lib


def _compile(source: str, lib: Path) -> None:
    tc = toolchain()
    src = lib.with_suffix(".cpp")
    _atomic_write(src, source)
    tmp = lib.with_name(f"{lib.name}.tmp{os.getpid()}_{threading.get_ident()}")
    cmd = [tc.cxx, *tc.flags, str(src), "-o", str(tmp), *tc.libs]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise KernelCompileError(f"C++ kernel {src} did not build in {BUILD_TIMEOUT_S} s") from e
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-8:]
        raise KernelCompileError(f"C++ kernel {src} did not build ({Path(tc.cxx).name} exit "
                                 f"{proc.returncode}): {' | '.join(tail)}")
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    os.replace(tmp, lib)
    _atomic_write(_digest_file(lib), digest)  # last: until it is there, the library is not trusted
    stats["builds"] += 1
    stats["build_seconds"] += time.perf_counter() - t0


# -- loading and calling -----------------------------------------------------------------------
@dataclass(frozen=True)
class CppKernel:
    """One loaded kernel: ``address`` of ``int64_t fn(const int64_t *args)``, its library."""

    name: str
    address: int
    path: Path
    handle: ctypes.CDLL


_kernels: dict[tuple[str, str], CppKernel] = {}


def kernel(source: str, symbol: str, *, name: str = "cpp_kernel") -> CppKernel:
    """The kernel ``symbol`` (``extern "C"``) of ``source``, built or reused, loaded once per
    process.

    Raises:
        CppUnavailableError, KernelCompileError: see :func:`build`; also when the library does
            not load or lacks ``symbol``.
    """
    digest = hashlib.sha256(source.encode()).hexdigest()
    with _lock:
        k = _kernels.get((digest, symbol))
        if k is not None:
            return k
        path = build(source, name)
        try:
            handle = ctypes.CDLL(str(path))
        except OSError:
            # a library that hashes right yet does not load: rebuild it once, then give up
            log.warning("C++ kernel %s does not load; rebuilding it", path)
            _digest_file(path).unlink(missing_ok=True)
            path = build(source, name)
            try:
                handle = ctypes.CDLL(str(path))
            except OSError as e:
                raise KernelCompileError(f"C++ kernel {path} does not load: {e}") from e
        try:
            fn = getattr(handle, symbol)
        except AttributeError as e:
            raise KernelCompileError(f"C++ kernel {path} has no symbol {symbol!r}") from e
        k = _kernels[(digest, symbol)] = CppKernel(symbol, ctypes.cast(fn, ctypes.c_void_p).value or 0, path, handle)
        return k


_PROTO = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.POINTER(ctypes.c_int64))


@functools.cache
def _ctypes_fn(address: int):
    return _PROTO(address)


def _ctypes_call(address: int, *args: int) -> int:
    return _ctypes_fn(address)((ctypes.c_int64 * max(1, len(args)))(*args))


def _build_launch_extension() -> Callable[..., int] | None:
    include = sysconfig.get_paths().get("include")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    if not include or not (Path(include) / "Python.h").exists():
        return None
    tc = toolchain()
    key = hashlib.sha256(LAUNCH_SOURCE.read_bytes() + f"{tc.cxx}|{tc.version}|{include}|{suffix}".encode())
    folder = _cache_root() / f"launch-{key.hexdigest()[:16]}"
    lib = folder / f"tw_cpp_launch{suffix}"
    if not is_valid(lib):
        folder.mkdir(parents=True, exist_ok=True)
        from filelock import FileLock

        with FileLock(str(folder / "build.lock")):
            if not is_valid(lib):
                tmp = lib.with_name(f"{lib.name}.tmp{os.getpid()}")
                cmd = [tc.cxx, "-x", "c", "-O2", "-fPIC", "-shared", "-w", f"-I{include}", str(LAUNCH_SOURCE),
                       "-o", str(tmp)]
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
                if proc.returncode != 0:
                    log.warning("the C++ kernel launcher did not build (%s); using ctypes",
                                (proc.stderr or proc.stdout).strip().splitlines()[-1:])
                    return None
                digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
                os.replace(tmp, lib)
                _atomic_write(_digest_file(lib), digest)
    spec = importlib.util.spec_from_file_location("tw_cpp_launch", lib)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as e:
        log.warning("the C++ kernel launcher does not load (%s); using ctypes", e)
        return None
    return module.call


@functools.cache
def launcher() -> Callable[..., int]:
    """``call(address, *ints) -> status``: the C extension, or ctypes where it cannot build."""
    return _build_launch_extension() or _ctypes_call


def ctypes_launcher() -> Callable[..., int]:
    """The ctypes form of :func:`launcher` (what runs without Python's headers)."""
    return _ctypes_call
