"""Compile driver for FlyDSL kernels (``pip install -e '.[flydsl]'``): compile-only, for an
explicit AMD architecture, in a fresh worker process per kernel, returning the ISA and the
kernel's LDS and register use.

FlyDSL (ROCm/FlyDSL, PyPI ``flydsl``) traces ``@flyc.jit`` / ``@flyc.kernel`` Python to MLIR and
links the code object with ``ld.lld``. What it needs on a machine with no GPU (measured, 0.5.0):

- ``COMPILE_ONLY=1``: compile and stop (no device runtime is loaded);
- ``FLYDSL_GPU_ARCH=gfx950``: with no arch set it silently assumes gfx942, so every compile
  here names its arch and refuses an empty one;
- ``ROCM_PATH=<folder>`` where ``<folder>/llvm/bin/ld.lld`` runs Debian's ``ld.lld-19`` and
  ``<folder>/amdgcn/bitcode/`` exists (it may be empty): ``make flydsl-setup`` prepares
  ``<venv>/rocm`` that way (``TILEWRIGHT_FLYDSL_ROCM`` points elsewhere);
- ``FLYDSL_DEBUG_DUMP_ASM=1`` with ``FLYDSL_DUMP_DIR``: writes the final ISA
  (``<kernel name>/NN_final_isa.s``), the artifact the instruction checks read.

The environment is read when FlyDSL is imported and when it compiles, so each compile runs in a
child process (:data:`CHILD`: this module's ``_child_main(SOURCE)``) with exactly that
environment: a bad kernel that aborts LLVM, or a hang, costs that one process. FlyDSL's own
on-disk kernel cache is switched off there (a cache hit would skip the ISA dump).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tilewright.errors import EnvironmentMismatchError, KernelCompileError
from tilewright.runtime.toolchain import dist_version

DIST = "flydsl"
# the version the templates are written against (pyproject's `flydsl` extra pins the same)
PINNED_VERSION = "0.5.0"
NOT_INSTALLED = "flydsl is not installed: pip install -e '.[flydsl]' (pins flydsl==0.5.0)"
SETUP_STEP = "make flydsl-setup"
# LDS (shared memory) a workgroup may allocate on gfx950 (CDNA4: 160 KiB per CU), in bytes
LDS_LIMIT = {"gfx950": 160 * 1024, "gfx942": 64 * 1024}


# the child's program: ``-c`` rather than ``-m`` this module, which the package's own import
# loads first (runpy would warn and run it twice)
CHILD = "import sys; from tilewright.templates.flydsl.runtime import _child_main; _child_main(sys.argv[1])"


class FlyDslToolchainError(EnvironmentMismatchError):
    """FlyDSL or the linker it needs is missing; the message names the step that installs it."""


class FlyDslCompileError(KernelCompileError):
    """FlyDSL refused or failed to compile a kernel; the message carries its error output."""


def dsl_version() -> str | None:
    """Installed ``flydsl`` version, or None (a cheap check: nothing is imported)."""
    return dist_version(DIST)


def available() -> bool:
    """True when ``flydsl`` is installed."""
    return dsl_version() is not None


def mlir_conflict() -> str | None:
    """Why FlyDSL cannot be imported into this process (None when it can): CuTeDSL's MLIR is
    already loaded here, and a second MLIR build in one process aborts it (both register LLVM's
    command-line options; measured: ``Fatal Python error: Aborted`` importing FlyDSL after
    CuTeDSL compiled a kernel). AOT builds run FlyDSL in a subprocess and are not affected."""
    if "flydsl._mlir" in sys.modules:
        return None
    if any(name.startswith("cutlass._mlir") for name in sys.modules):
        return ("CuTeDSL's MLIR is loaded in this process and importing FlyDSL's would abort it (two "
                "MLIR builds register the same LLVM options): launch FlyDSL kernels from a process "
                "that has not used CuTeDSL")
    return None


def rocm_root() -> Path:
    """The folder passed as ``ROCM_PATH``: ``$TILEWRIGHT_FLYDSL_ROCM``; else ``<sys.prefix>/rocm``
    (inside the virtual environment, where ``make flydsl-setup`` puts it) when it exists; else a
    ROCm install (``$ROCM_PATH``, ``/opt/rocm``), which a gfx950 machine has; else the venv path
    (missing: the reason then names the setup step)."""
    env = os.environ.get("TILEWRIGHT_FLYDSL_ROCM")
    if env:
        return Path(env)
    venv = Path(sys.prefix) / "rocm"
    if venv.is_dir():
        return venv
    for root in (os.environ.get("ROCM_PATH"), "/opt/rocm"):
        if root and (Path(root) / "llvm" / "bin" / "ld.lld").exists():
            return Path(root)
    return venv


def toolchain_problem() -> str | None:
    """Why a FlyDSL compile cannot run here (None when it can): flydsl missing, or the ROCm
    folder without a working ``llvm/bin/ld.lld`` or ``amdgcn/bitcode/``."""
    if not available():
        return NOT_INSTALLED
    root = rocm_root()
    lld = root / "llvm" / "bin" / "ld.lld"
    if not (lld.exists() and os.access(lld, os.X_OK)):
        return (f"{lld} is missing or not executable: run `{SETUP_STEP}` (installs Debian's lld-19 "
                f"and links it there), or set TILEWRIGHT_FLYDSL_ROCM to a folder laid out that way")
    if not (root / "amdgcn" / "bitcode").is_dir():
        return f"{root / 'amdgcn' / 'bitcode'} is missing: run `{SETUP_STEP}`"
    return None


@dataclass(frozen=True)
class FlyCompileResult:
    """One compiled kernel.

    Attributes:
        isa_path: the final ISA FlyDSL dumped (AMDGCN assembly text).
        kernel_name: the ``.amdhsa_kernel`` symbol.
        arch: the ``.amdgcn_target`` the ISA was built for ("gfx950").
        lds_bytes: LDS the kernel allocates (``.amdhsa_group_segment_fixed_size``), bytes.
        vgprs, agprs, sgprs: registers per lane (VGPR/AGPR) and per wave (SGPR) it uses.
        scratch_bytes: private (spill) memory per lane, bytes; 0 when nothing spilled.
        seconds: wall time of the child process (import + trace + compile + link).
    """

    isa_path: Path
    kernel_name: str
    arch: str
    lds_bytes: int
    vgprs: int
    agprs: int
    sgprs: int
    scratch_bytes: int
    seconds: float

    @property
    def isa(self) -> str:
        return self.isa_path.read_text(errors="replace")

    def to_json(self) -> dict:
        return {"kernel_name": self.kernel_name, "gpu_arch": self.arch, "lds_bytes": self.lds_bytes,
                "vgprs": self.vgprs, "agprs": self.agprs, "sgprs": self.sgprs,
                "scratch_bytes": self.scratch_bytes, "flydsl": dsl_version()}


def _field(isa: str, name: str) -> int:
    m = re.search(rf"^\s*\.?{re.escape(name)}:?\s+(\d+)", isa, re.M)
    return int(m.group(1)) if m else 0


def parse_isa(isa_path: Path, seconds: float = 0.0) -> FlyCompileResult:
    """Read the kernel name, target, LDS and register figures out of an ISA dump."""
    isa = isa_path.read_text(errors="replace")
    name = re.search(r"^\s*\.amdhsa_kernel\s+(\S+)", isa, re.M)
    target = re.search(r'\.amdgcn_target\s+"[^"]*-(gfx\w+)"', isa)
    return FlyCompileResult(
        isa_path=isa_path, kernel_name=name.group(1) if name else "",
        arch=target.group(1) if target else "",
        lds_bytes=_field(isa, ".amdhsa_group_segment_fixed_size"),
        vgprs=_field(isa, ".vgpr_count"), agprs=_field(isa, ".agpr_count"),
        sgprs=_field(isa, ".sgpr_count"),
        scratch_bytes=_field(isa, ".amdhsa_private_segment_fixed_size"), seconds=seconds)


def compile_env(arch: str, dump_dir: Path) -> dict[str, str]:
    """The child's environment: this one plus FlyDSL's compile-only settings for ``arch``.

    Raises:
        ValueError: an empty or non-AMD architecture (FlyDSL would assume gfx942).
    """
    if not arch or not re.fullmatch(r"gfx\d+\w*", arch):
        raise ValueError(f"FlyDSL compiles need an explicit AMD architecture like 'gfx950', got {arch!r}")
    env = dict(os.environ)
    env.update({
        "COMPILE_ONLY": "1", "FLYDSL_GPU_ARCH": arch, "ROCM_PATH": str(rocm_root()),
        "FLYDSL_DEBUG_DUMP_ASM": "1", "FLYDSL_DUMP_DIR": str(dump_dir),
        "FLYDSL_RUNTIME_ENABLE_CACHE": "0", "FLYDSL_RUNTIME_CACHE_DIR": str(dump_dir / "cache"),
    })
    env.pop("FLYDSL_DUMP_IR", None)  # the ISA alone; FLYDSL_DUMP_IR=1 would write every MLIR stage
    return env


def compile_source(source_path: Path | str, arch: str, dump_dir: Path | str, *,
                   timeout_s: float = 600.0) -> FlyCompileResult:
    """Compile the rendered FlyDSL module at ``source_path`` for ``arch`` in a child process,
    by calling its ``compile_aot()``; the ISA lands under ``dump_dir``.

    Raises:
        FlyDslToolchainError: flydsl or the linker folder is missing (names the fix).
        FlyDslCompileError: the compile failed, crashed or ran past ``timeout_s`` seconds.
        ValueError: no explicit architecture.
    """
    why = toolchain_problem()
    if why:
        raise FlyDslToolchainError(why)
    dump_dir = Path(dump_dir)
    shutil.rmtree(dump_dir, ignore_errors=True)
    dump_dir.mkdir(parents=True)
    env = compile_env(arch, dump_dir)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, str(source_path)],
                              env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise FlyDslCompileError(f"FlyDSL compile of {source_path} ran past {timeout_s:.0f} s") from None
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise FlyDslCompileError(f"FlyDSL compile of {source_path} for {arch} failed "
                                 f"(exit {proc.returncode}):\n{(proc.stderr or proc.stdout)[-3000:]}")
    isas = sorted(dump_dir.glob("*/*final_isa.s"))
    if len(isas) != 1:
        raise FlyDslCompileError(f"expected one ISA dump under {dump_dir}, found {[str(p) for p in isas]}")
    result = parse_isa(isas[0], seconds)
    if result.arch != arch:
        raise FlyDslCompileError(f"FlyDSL built for {result.arch!r}, not the requested {arch!r}")
    return result


def compile_aot_job(job, root: Path):
    """Build one :class:`tilewright.runtime.aot.CompileJob` of language "flydsl" into
    ``root/<job.name>/``: ``kernel.py`` (the rendered source) and ``kernel.amdgcn`` (the ISA)."""
    from tilewright.runtime.aot import CompileResult, sha256_file

    folder = root / job.name
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / "kernel.py"
    src.write_text(job.source)
    res = compile_source(src, job.spec["options"]["gpu_arch"], folder / "dump")
    isa = folder / "kernel.amdgcn"
    shutil.copyfile(res.isa_path, isa)
    shutil.rmtree(folder / "dump", ignore_errors=True)
    artifacts = {"source": f"{job.name}/kernel.py", "amdgcn": f"{job.name}/kernel.amdgcn"}
    hashes = {"source": sha256_file(src), "amdgcn": sha256_file(isa)}
    meta = {**res.to_json(), "name": res.kernel_name, "shared": res.lds_bytes}
    return CompileResult(job.name, job.key, "built", res.seconds, artifacts, hashes, meta)


def _child_main(source_path: str) -> None:
    """In the child: import the rendered module and run its ``compile_aot()``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tw_flydsl_kernel", source_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    module.compile_aot()
    sys.stdout.write(json.dumps({"ok": True}) + "\n")


if __name__ == "__main__":
    _child_main(sys.argv[1])
