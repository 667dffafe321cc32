"""Glue the rendered CuTeDSL kernel modules call: is the DSL installed, compile options that never
let the architecture default, pointers from torch tensors, the stream, the SM count.

CuTeDSL (``nvidia-cutlass-dsl``) compiles a ``@cute.jit`` host function and its kernels with
``cute.compile``. Without ``--gpu-arch`` it targets the local GPU, or silently sm_100a where
there is none (measured with 4.8.1): every compile here names its architecture. The rendered
modules take raw pointers and 32-bit sizes, so one compile serves every problem size, and an
ahead-of-time compile needs no real memory (pointers at address 0, see ``compile_aot`` in the
templates).
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from tilewright.runtime.aot import CompileJob, CompileResult, load_source, sha256_file
from tilewright.runtime.toolchain import dist_version

DIST = "nvidia-cutlass-dsl"
NOT_INSTALLED = "nvidia-cutlass-dsl is not installed"


def dsl_version() -> str | None:
    """Installed ``nvidia-cutlass-dsl`` version, or None (a cheap check: nothing is imported)."""
    return dist_version(DIST)


def available() -> bool:
    """True when ``nvidia-cutlass-dsl`` is installed (``pip install -e '.[cutedsl]'``)."""
    return dsl_version() is not None


def compile_options(arch: str, dump_dir: str | None = None) -> str:
    """``cute.compile`` options for ``arch`` ("sm_90a", "sm_100a"), keeping PTX and cubin in
    ``dump_dir`` when given (the folder must exist: CuTeDSL skips the dump silently otherwise).

    Raises:
        ValueError: an empty or malformed architecture (CuTeDSL would pick one on its own).
    """
    if not arch or not arch.startswith("sm_"):
        raise ValueError(f"CuTeDSL compiles need an explicit architecture like 'sm_90a', got {arch!r}")
    opts = f"--gpu-arch {arch}"
    if dump_dir is not None:
        opts += f" --keep-ptx --keep-cubin --dump-dir {dump_dir}"
    return opts


def local_arch(device: torch.device) -> str:
    """The architecture string of a CUDA device ("sm_90a", "sm_100a", ...).

    Raises:
        UnknownTargetError: a device tilewright has no target for.
    """
    from tilewright.runtime.targets import detect_target

    return detect_target(device).arch


def gmem_ptr(t: torch.Tensor, dtype: Any, align: int) -> Any:
    """A CuTe global-memory pointer to ``t``'s first element, typed ``dtype`` (a cutlass numeric
    type), promising ``align``-byte alignment.

    Raises:
        ValueError: the tensor's address is not ``align``-byte aligned.
    """
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    if t.data_ptr() % align:
        raise ValueError(f"tilewright: tensor at {t.data_ptr():#x} is not {align}-byte aligned")
    return make_ptr(dtype, t.data_ptr(), cute.AddressSpace.gmem, assumed_align=align)


def fake_ptr(dtype: Any, align: int) -> Any:
    """A pointer that is never dereferenced: what an ahead-of-time compile is traced with."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    return make_ptr(dtype, 0, cute.AddressSpace.gmem, assumed_align=align)


def current_stream(device: torch.device) -> Any:
    """The current torch stream of ``device`` as a CUDA driver stream handle."""
    import cuda.bindings.driver as cuda

    return cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)


def fake_stream() -> Any:
    from cutlass.cute.runtime import make_fake_stream

    return make_fake_stream()


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device``: how many CTAs a persistent kernel keeps resident."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def ready(t: torch.Tensor, inner: int, align_elems: int) -> torch.Tensor:
    """``t`` (2-D) itself when dim ``inner`` is contiguous, the other stride is a multiple of
    ``align_elems`` and the base is 16-byte aligned; else a copy laid out that way (correct,
    slower). TMA descriptors and the vectorised epilogue need exactly these facts."""
    outer = 1 - inner
    if t.stride(inner) == 1 and t.stride(outer) % align_elems == 0 and t.data_ptr() % 16 == 0:
        return t
    if inner == 0:
        return ready(t.t(), 1, align_elems).t()
    cols = t.shape[1]
    pad = (-cols) % align_elems
    buf = torch.empty(t.shape[0], cols + pad, dtype=t.dtype, device=t.device)
    view = buf[:, :cols]
    view.copy_(t)
    return view


# CuTeDSL dump files by suffix -> artifact stage (the MLIR dumps, when asked for, keep theirs)
_CUTEDSL_STAGES = {".ptx": "ptx", ".cubin": "cubin", ".sass": "sass"}


def compile_cutedsl(job: CompileJob, root: Path) -> CompileResult:
    """The language's ``aot_compile`` (run in a :func:`tilewright.runtime.aot.compile_jobs`
    worker): call the rendered module's ``compile_aot(arch, dump_dir)`` and collect what it
    dumped (``<host function>.<arch>.ptx`` and ``.cubin``) as ``kernel.ptx`` / ``kernel.cubin``.

    Raises:
        RuntimeError: the dump holds no PTX or no cubin.
    """

    folder = root / job.name
    arch = job.spec["options"]["gpu_arch"]
    t0 = time.perf_counter()
    module, src_path = load_source(job, folder)
    dump = folder / "dump"
    shutil.rmtree(dump, ignore_errors=True)
    module.compile_aot(arch, str(dump))
    seconds = time.perf_counter() - t0
    artifacts, hashes = {"source": f"{job.name}/kernel.py"}, {"source": sha256_file(src_path)}
    for f in sorted(dump.iterdir()):
        stage = _CUTEDSL_STAGES.get(f.suffix, f.suffix.lstrip("."))
        if not stage or stage in artifacts:
            continue
        path = folder / f"kernel.{stage}"
        f.replace(path)
        artifacts[stage] = f"{job.name}/{path.name}"
        hashes[stage] = sha256_file(path)
    shutil.rmtree(dump, ignore_errors=True)
    if "ptx" not in artifacts or "cubin" not in artifacts:
        raise RuntimeError(f"compile_aot({arch!r}) dumped {sorted(artifacts)}: no PTX/cubin")
    ptx = (folder / "kernel.ptx").read_text(errors="replace")
    entries = re.findall(r"\.entry\s+(\w+)", ptx)
    target = re.search(r"^\.target\s+(\S+)", ptx, re.M)
    metadata = {"name": entries[0] if entries else "", "gpu_arch": target.group(1) if target else "",
                "cutlass_dsl": dsl_version()}
    return CompileResult(job.name, job.key, "built", seconds, artifacts, hashes, metadata)
