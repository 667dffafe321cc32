"""Target registry: what each chip tilewright generates kernels for can do.

A target is (backend, arch) such as ``cuda:sm_90a`` or ``hip:gfx950``, with the figures the
candidate policies and the analytic cost model need. Each GPU target is described by one
representative part (the one named in ``device``); peak rates are dense (no sparsity) tensor-core
rates from the vendor's datasheet cited in ``source``; measured figures are noted where we have
them. ``cpu`` is this host, where Triton kernels run under the interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from tilewright.errors import UnknownTargetError

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True)
class Target:
    """One compilation target and its hardware figures.

    Attributes:
        name: registry key, "<backend>:<arch>" (e.g. "cuda:sm_90a"), or "cpu"/"mps"/"xpu".
        backend: "cuda", "hip", "cpu", "mps" or "xpu".
        arch: "sm_90a", "sm_100a", "sm_120", "gfx942", "gfx950", "gfx1250", "cpu", ...
        device: the representative part the figures describe.
        num_sms: streaming multiprocessors / compute units / Xe cores.
        warp_size: threads per warp (wavefront).
        smem_per_block: shared memory (LDS) one block may use, bytes.
        regs_per_sm: 32-bit registers per SM / CU.
        l2_bytes: last-level on-chip cache, bytes.
        peak_tflops: dense peak per input dtype ("bf16", "fp16", "fp32", "fp8", "fp4"), TFLOP/s.
        hbm_gbps: DRAM bandwidth, GB/s.
        features: capability names (see ``FEATURES``).
        triton: (backend, arch, warp_size) for ``triton.backends.compiler.GPUTarget``, or None.
        source: where the figures come from.
        max_threads_per_block: threads one block (threadgroup, work-group) may hold; 1024 on
            every registered GPU (CUDA, ROCm, Apple's ``maxTotalThreadsPerThreadgroup``, PVC).
        tensors: the torch device type of the tensors its kernels take where that is not the
            backend's own ("cpu" for ``xpu:opencl-cpu``, whose SYCL kernels run on this host's
            OpenCL CPU device); see :attr:`device_type`.
        needs: ``() -> str | None``: why this target's device cannot be used on this machine
            (a missing runtime, with the fix), None when it can; None: nothing beyond torch.
        slow_first_launch: the device spends long on a kernel's first launch (the OpenCL CPU
            device, ~1.5 ms, measured), so a first run is no fair sample of a kernel's time.
    """

    name: str
    backend: str
    arch: str
    device: str
    num_sms: int
    warp_size: int
    smem_per_block: int
    regs_per_sm: int
    l2_bytes: int
    peak_tflops: tuple[tuple[str, float], ...]
    hbm_gbps: float
    features: frozenset[str] = field(default_factory=frozenset)
    triton: tuple[str, str | int, int] | None = None
    source: str = ""
    max_threads_per_block: int = 1024
    tensors: str = ""
    needs: Callable[[], str | None] | None = None
    slow_first_launch: bool = False

    @property
    def device_type(self) -> str:
        """The torch device type of the tensors its kernels take: "cuda" (CUDA and ROCm GPUs),
        "cpu", "mps", "xpu"."""
        return self.tensors or ("cuda" if self.backend in ("cuda", "hip") else self.backend)

    def unavailable(self) -> str | None:
        """Why this target's device cannot be used here (:attr:`needs`), None when it can."""
        return None if self.needs is None else self.needs()

    def local_device(self) -> torch.device | None:
        """The device of this machine that is this target, to check and time candidates on, or
        None when it is not this machine: the host CPU for targets whose kernels take CPU
        tensors (when :meth:`unavailable` says nothing is missing), the current GPU when
        :func:`detect_target` names this target for it, the Apple GPU when torch has MPS."""
        kind = self.device_type
        if kind == "cpu":
            return torch.device("cpu") if self.unavailable() is None else None
        if kind == "cuda" and torch.cuda.is_available():
            dev = torch.device("cuda", torch.cuda.current_device())
            return dev if _local_target_name(dev) == self.name else None
        if kind == "mps" and torch.backends.mps.is_available():
            # on a Mac Metal candidates are checked and timed like any other, never picked
            # unmeasured (they are compile-checked only until one has run there)
            return torch.device("mps")
        return None

    def local_devices(self) -> list[str]:
        """Devices of this machine that are this target, for worker processes ("cuda:0", ...;
        ["cpu"] for a target whose kernels take CPU tensors); none for MPS, whose candidates
        are measured in the tuning process."""
        kind = self.device_type
        if kind == "cpu":
            return ["cpu"] if self.unavailable() is None else []
        if kind != "cuda" or not torch.cuda.is_available():
            return []
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())
                if _local_target_name(torch.device("cuda", i)) == self.name]

    @property
    def interpreted(self) -> bool:
        """True when Triton kernels for this target run under ``TRITON_INTERPRET`` (the CPU)."""
        return self.backend == "cpu"

    @property
    def aot_target(self) -> tuple[str, str | int, int] | None:
        """(backend, arch, warp_size) the ahead-of-time compile driver (:mod:`tilewright.runtime.aot`)
        builds kernels for, or None where no worker compiler targets this chip (a language's
        AOT writer may still write its kernels: ``Language.aot_writer``)."""
        return self.triton

    def peak(self, dtype: str) -> float:
        """Dense peak TFLOP/s for an input dtype; fp32 falls back to the fp32 (non-TF32) rate.
        Block-scaled formats take the rate of their element type (nvfp4/mxfp4: fp4, mxfp8:
        fp8); on a chip without that MMA they are dequantised into a bf16 one, so bf16's."""
        table = dict(self.peak_tflops)
        if dtype in table:
            return table[dtype]
        if dtype in ("nvfp4", "mxfp4", "mxfp8"):
            native = "fp8" if dtype == "mxfp8" else "fp4"
            return table.get(native, table.get("bf16", table.get("fp32", min(table.values()))))
        if dtype.startswith("fp8") and "fp8" in table:
            return table["fp8"]
        return table.get("fp32", min(table.values()))

    def has(self, feature: str) -> bool:
        return feature in self.features

    def __str__(self) -> str:
        return self.name


def _local_target_name(dev: torch.device) -> str | None:
    """The target a local GPU is, or None for one tilewright has no target for (it can then
    measure nothing, and chooses as for a remote target)."""
    try:
        return detect_target(dev).name
    except UnknownTargetError:
        return None


def _sycl_missing() -> str | None:
    """Why the SYCL language's toolchain (which runs the OpenCL CPU device) is unusable here."""
    from tilewright.runtime.languages import get_language  # by name: the runtime imports no template

    return get_language("sycl").check()


FEATURES = {
    "wgmma": "Hopper warpgroup MMA",
    "tcgen05": "Blackwell 5th-gen tensor core MMA (UMMA) with tensor memory",
    "mma_sync": "warp-level mma.sync",
    "tma": "Tensor Memory Accelerator bulk tensor copies (cp.async.bulk.tensor)",
    "tdm": "AMD Tensor Data Mover (tensor_load_to_lds)",
    "mfma": "AMD CDNA matrix fused multiply-add",
    "wmma": "AMD wave matrix multiply-accumulate (gfx12)",
    "pdl": "programmatic dependent launch (griddepcontrol)",
    "fp8_e4m3": "OCP fp8 e4m3 MMA",
    "fp8_e4m3fnuz": "AMD fnuz fp8 e4m3 MMA",
    "block_scaled_mma": "MMA with per-block scale factors (MXFP4/MXFP8/NVFP4)",
    "nvfp4": "NVFP4 (e2m1 + e4m3 scale per 16) MMA",
    "mxfp4": "MXFP4 (e2m1 + e8m0 scale per 32) MMA",
    "clusters": "thread-block clusters / distributed shared memory",
}

_NV = "https://www.nvidia.com/en-us/data-center/"
_TARGETS = [
    Target(
        "cuda:sm_80", "cuda", "sm_80", "NVIDIA A100 SXM4 80 GB", num_sms=108, warp_size=32,
        smem_per_block=163 * KiB, regs_per_sm=65536, l2_bytes=40 * MiB,
        peak_tflops=(("bf16", 312.0), ("fp16", 312.0), ("tf32", 156.0), ("fp32", 19.5)),
        hbm_gbps=2039.0,
        features=frozenset({"mma_sync"}),
        triton=("cuda", 80, 32),
        source=f"{_NV}a100/ A100 datasheet (dense = half the sparse figure; 2,039 GB/s is the "
               "80 GB SXM4 part); 108 SMs, 40 MB L2, 164 KB shared memory per SM (163 KB per "
               "block) from the NVIDIA Ampere architecture whitepaper"),
    Target(
        "cuda:sm_89", "cuda", "sm_89", "NVIDIA L4 (Ada)", num_sms=58, warp_size=32,
        smem_per_block=99 * KiB, regs_per_sm=65536, l2_bytes=48 * MiB,
        peak_tflops=(("bf16", 121.0), ("fp16", 121.0), ("tf32", 60.0), ("fp32", 30.3),
                     ("fp8", 242.0)),
        hbm_gbps=300.0,
        features=frozenset({"mma_sync", "fp8_e4m3"}),
        triton=("cuda", 89, 32),
        source=f"{_NV}l4/ L4 datasheet (dense = half the sparse figure: 242 fp16/bf16, 485 "
               "fp8, 120 tf32 sparse); 58 SMs (7,424 CUDA cores), 48 MB L2; compute "
               "capability 8.9 gives 100 KB shared memory per SM (99 KB per block). RTX 4090 "
               "(128 SMs, 1,008 GB/s) and L40S are 8.9 too: same code, other figures"),
    Target(
        "cuda:sm_90a", "cuda", "sm_90a", "NVIDIA H200 SXM (also H100 SXM)", num_sms=132,
        warp_size=32, smem_per_block=227 * KiB, regs_per_sm=65536, l2_bytes=50 * MiB,
        peak_tflops=(("bf16", 989.4), ("fp16", 989.4), ("tf32", 494.7), ("fp32", 66.9),
                     ("fp8", 1978.9)),
        hbm_gbps=4800.0,
        features=frozenset({"wgmma", "mma_sync", "tma", "pdl", "fp8_e4m3", "clusters"}),
        triton=("cuda", 90, 32),
        source=f"{_NV}h200/ datasheet (dense = half the sparse figure); measured here: "
               "~790 TFLOP/s bf16, ~4.3 TB/s copy"),
    Target(
        "cuda:sm_100a", "cuda", "sm_100a", "NVIDIA B200 (HGX)", num_sms=148, warp_size=32,
        smem_per_block=227 * KiB, regs_per_sm=65536, l2_bytes=126 * MiB,
        peak_tflops=(("bf16", 2250.0), ("fp16", 2250.0), ("tf32", 1100.0), ("fp32", 75.0),
                     ("fp8", 4500.0), ("fp4", 9000.0)),
        hbm_gbps=8000.0,
        features=frozenset({"tcgen05", "mma_sync", "tma", "pdl", "fp8_e4m3", "clusters",
                            "block_scaled_mma", "nvfp4", "mxfp4"}),
        triton=("cuda", 100, 32),
        source=f"{_NV}hgx/ HGX B200 datasheet (dense = half the sparse figure)"),
    Target(
        "cuda:sm_103a", "cuda", "sm_103a", "NVIDIA B300 (HGX, Blackwell Ultra)", num_sms=148,
        warp_size=32, smem_per_block=227 * KiB, regs_per_sm=65536, l2_bytes=126 * MiB,
        peak_tflops=(("bf16", 2250.0), ("fp16", 2250.0), ("tf32", 1125.0), ("fp32", 75.0),
                     ("fp8", 4500.0), ("fp4", 13500.0)),
        hbm_gbps=8000.0,
        features=frozenset({"tcgen05", "mma_sync", "tma", "pdl", "fp8_e4m3", "clusters",
                            "block_scaled_mma", "nvfp4", "mxfp4"}),
        triton=("cuda", 103, 32),
        source=f"{_NV}hgx/ HGX B300 datasheet, per GPU of 8 (dense: 36 PF bf16 and 108 PF fp4 "
               "per board / 8); SM count is the enabled part's (NVIDIA's Blackwell Ultra blog "
               "gives 160 for the full die); L2 and shared memory as B200 (same SM design). "
               "sm_103a cubins are its own: sm_100a ones do not load here"),
    Target(
        "cuda:sm_110a", "cuda", "sm_110a", "NVIDIA Jetson AGX Thor (T5000)", num_sms=20,
        warp_size=32, smem_per_block=227 * KiB, regs_per_sm=65536, l2_bytes=32 * MiB,
        peak_tflops=(("bf16", 259.0), ("fp16", 259.0), ("tf32", 129.0), ("fp32", 8.0),
                     ("fp8", 517.0), ("fp4", 1035.0)),
        hbm_gbps=273.0,
        features=frozenset({"tcgen05", "mma_sync", "tma", "pdl", "fp8_e4m3", "clusters",
                            "block_scaled_mma", "nvfp4", "mxfp4"}),
        triton=("cuda", 110, 32),
        source="NVIDIA Jetson AGX Thor module data sheet: 2,070 fp4 TFLOPS sparse (1,035 "
               "dense), 2,560 CUDA cores, 128 GB LPDDR5X at 273 GB/s; 20 SMs, 32 MiB L2 and "
               "228 KiB shared memory per SM as the CUDA driver reports them (NVIDIA developer "
               "forum, 'CUDA core and Tensor Core counts for Jetson AGX Thor'); fp8/bf16 rates "
               "derived from fp4 at the Blackwell tensor-core ratio (1/2, 1/4), fp32 from "
               "2,560 cores at 1.57 GHz: estimates"),
    Target(
        "cuda:sm_120", "cuda", "sm_120", "NVIDIA GeForce RTX 5090", num_sms=170, warp_size=32,
        smem_per_block=99 * KiB, regs_per_sm=65536, l2_bytes=96 * MiB,
        peak_tflops=(("bf16", 209.5), ("fp16", 209.5), ("tf32", 104.8), ("fp32", 104.8),
                     ("fp8", 419.0), ("fp4", 838.0)),
        hbm_gbps=1792.0,
        features=frozenset({"mma_sync", "tma", "pdl", "fp8_e4m3", "block_scaled_mma",
                            "nvfp4", "mxfp4"}),
        triton=("cuda", 120, 32),
        source="NVIDIA RTX Blackwell GPU architecture whitepaper (GeForce RTX 5090, dense, "
               "fp32 accumulate)"),
    Target(
        "cuda:sm_121", "cuda", "sm_121", "NVIDIA GB10 (DGX Spark)", num_sms=48, warp_size=32,
        smem_per_block=99 * KiB, regs_per_sm=65536, l2_bytes=24 * MiB,
        peak_tflops=(("bf16", 125.0), ("fp16", 125.0), ("tf32", 62.5), ("fp32", 31.0),
                     ("fp8", 250.0), ("fp4", 500.0)),
        hbm_gbps=273.0,
        features=frozenset({"mma_sync", "tma", "pdl", "fp8_e4m3", "block_scaled_mma",
                            "nvfp4", "mxfp4"}),
        triton=("cuda", 121, 32),
        source="NVIDIA DGX Spark data sheet: 1 PFLOP fp4 with sparsity (500 dense), 31 TFLOP/s "
               "fp32, 6,144 CUDA cores (48 SMs), 128 GB LPDDR5X at 273 GB/s; 100 KB shared "
               "memory per SM and 24 MB L2 as reported on the device (huggingface/kernels PR "
               "283, which also measured ~92 TFLOP/s bf16); fp8/bf16 peaks derived from fp4 "
               "at 1/2 and 1/4: estimates. sm_121 runs sm_120-family code, but triton builds "
               "arch-specific sm_121a cubins that an sm_120 device does not load (nor the "
               "reverse)"),
    Target(
        "hip:gfx942", "hip", "gfx942", "AMD Instinct MI300X", num_sms=304, warp_size=64,
        smem_per_block=64 * KiB, regs_per_sm=4 * 512 * 64, l2_bytes=256 * MiB,
        peak_tflops=(("bf16", 1307.4), ("fp16", 1307.4), ("tf32", 653.7), ("fp32", 163.4),
                     ("fp8", 2614.9)),
        hbm_gbps=5300.0,
        features=frozenset({"mfma", "fp8_e4m3fnuz"}),
        triton=("hip", "gfx942", 64),
        source="AMD Instinct MI300X data sheet (dense; L2 figure is the 256 MB Infinity Cache)"),
    Target(
        "hip:gfx950", "hip", "gfx950", "AMD Instinct MI355X", num_sms=256, warp_size=64,
        smem_per_block=160 * KiB, regs_per_sm=4 * 512 * 64, l2_bytes=256 * MiB,
        peak_tflops=(("bf16", 2516.6), ("fp16", 2516.6), ("fp32", 157.3), ("fp8", 5033.2),
                     ("fp4", 10066.4)),
        hbm_gbps=8000.0,
        features=frozenset({"mfma", "fp8_e4m3", "block_scaled_mma", "mxfp4"}),
        triton=("hip", "gfx950", 64),
        source="AMD Instinct MI355X data sheet (dense; 160 KB LDS per CU on CDNA4)"),
    Target(
        "hip:gfx1250", "hip", "gfx1250", "AMD Instinct MI450 (announced)", num_sms=256,
        warp_size=32, smem_per_block=320 * KiB, regs_per_sm=4 * 512 * 32, l2_bytes=256 * MiB,
        peak_tflops=(("bf16", 5000.0), ("fp16", 5000.0), ("fp32", 160.0), ("fp8", 20000.0),
                     ("fp4", 40000.0)),
        hbm_gbps=19600.0,
        features=frozenset({"wmma", "tdm", "fp8_e4m3", "block_scaled_mma", "mxfp4"}),
        triton=("hip", "gfx1250", 32),
        source="AMD announced MI450 figures (40 PF fp4, 20 PF fp8, 19.6 TB/s HBM4); CU count, "
               "LDS size and bf16 rate are estimates until a data sheet is published"),
    Target(
        "mps", "mps", "apple-gpu", "Apple M3 Max (40-core GPU)", num_sms=40, warp_size=32,
        smem_per_block=32 * KiB, regs_per_sm=65536, l2_bytes=48 * MiB,
        peak_tflops=(("fp32", 16.4), ("fp16", 16.4), ("bf16", 16.4)), hbm_gbps=400.0,
        source="Apple M3 Max technical specifications (unified memory bandwidth)"),
    Target(
        "xpu", "xpu", "pvc", "Intel Data Center GPU Max 1550", num_sms=128, warp_size=16,
        smem_per_block=128 * KiB, regs_per_sm=65536, l2_bytes=408 * MiB,
        peak_tflops=(("bf16", 838.9), ("fp16", 838.9), ("tf32", 419.4), ("fp32", 52.4)),
        hbm_gbps=3276.8,
        source="Intel Data Center GPU Max Series product brief"),
    # the xpu backend's kernels run on this host's OpenCL CPU device (config.cpu_target="xpu"):
    # its own entry, so tuning records measured there are never reused on an Intel GPU
    Target(
        "xpu:opencl-cpu", "xpu", "opencl-cpu", "host CPU as a SYCL device (OpenCL CPU runtime)",
        tensors="cpu", needs=_sycl_missing, slow_first_launch=True,
        num_sms=1, warp_size=16, smem_per_block=256 * KiB, regs_per_sm=1 << 30, l2_bytes=32 * MiB,
        peak_tflops=(("fp32", 0.1), ("fp16", 0.01), ("bf16", 0.01)), hbm_gbps=20.0,
        source="nominal (as cpu); local memory as the OpenCL CPU device of intel-opencl-rt "
               "2025.3 reports it (256 KiB); for correctness and CPU runs, not an XPU's figures"),
    Target(
        "cpu", "cpu", "cpu", "host CPU (Triton kernels interpreted)", num_sms=1, warp_size=1,
        smem_per_block=1 << 30, regs_per_sm=1 << 30, l2_bytes=32 * MiB,
        peak_tflops=(("fp32", 0.1), ("fp16", 0.01), ("bf16", 0.01)), hbm_gbps=20.0,
        source="nominal; the cpu target is for correctness, not speed"),
]

TARGETS: dict[str, Target] = {t.name: t for t in _TARGETS}
ALIASES = {
    "sm_80": "cuda:sm_80", "a100": "cuda:sm_80",
    "sm_89": "cuda:sm_89", "l4": "cuda:sm_89",
    "sm_90a": "cuda:sm_90a", "sm_90": "cuda:sm_90a", "h100": "cuda:sm_90a", "h200": "cuda:sm_90a",
    "sm_100a": "cuda:sm_100a", "sm_100": "cuda:sm_100a", "b200": "cuda:sm_100a",
    "sm_103a": "cuda:sm_103a", "sm_103": "cuda:sm_103a", "b300": "cuda:sm_103a",
    "sm_110a": "cuda:sm_110a", "sm_110": "cuda:sm_110a", "thor": "cuda:sm_110a",
    "sm_120": "cuda:sm_120", "rtx5090": "cuda:sm_120",
    "sm_121": "cuda:sm_121", "gb10": "cuda:sm_121", "dgx-spark": "cuda:sm_121",
    "gfx942": "hip:gfx942", "mi300x": "hip:gfx942",
    "gfx950": "hip:gfx950", "mi355x": "hip:gfx950",
    "gfx1250": "hip:gfx1250", "mi450": "hip:gfx1250",
    "sycl-cpu": "xpu:opencl-cpu",
}


def get_target(name: str | Target) -> Target:
    """Look a target up by name ("cuda:sm_90a") or alias ("h200", "gfx950").

    Raises:
        UnknownTargetError: the name is in neither table; the message lists the known names.
    """
    if isinstance(name, Target):
        return name
    key = ALIASES.get(name.lower(), name.lower())
    try:
        return TARGETS[key]
    except KeyError:
        raise UnknownTargetError(
            f"unknown target {name!r}; known targets: {', '.join(TARGETS)} "
            f"(aliases: {', '.join(ALIASES)})") from None


# CUDA compute capability -> target. Only exact (major, minor) pairs: Triton and CuTeDSL build
# arch-specific cubins (sm_90a, sm_100a, sm_120a, ...) that load only on the capability they
# were built for, and the figures (shared memory, SMs) differ within a major version too, so a
# capability not listed here is refused rather than mapped onto a neighbour's target.
CUDA_CAPABILITIES: dict[tuple[int, int], str] = {
    (8, 0): "cuda:sm_80", (8, 9): "cuda:sm_89", (9, 0): "cuda:sm_90a", (10, 0): "cuda:sm_100a",
    (10, 3): "cuda:sm_103a", (11, 0): "cuda:sm_110a", (12, 0): "cuda:sm_120", (12, 1): "cuda:sm_121",
}


def cuda_target(major: int, minor: int, name: str = "") -> Target:
    """The target for CUDA compute capability ``major.minor``.

    Raises:
        UnknownTargetError: a capability the registry does not describe; the message names it,
            the capabilities that are known, and what happens instead.
    """
    key = CUDA_CAPABILITIES.get((major, minor))
    if key is not None:
        return TARGETS[key]
    known = ", ".join(f"{a}.{b} ({t.split(':')[1]})" for (a, b), t in CUDA_CAPABILITIES.items())
    part = f" ({name})" if name else ""
    raise UnknownTargetError(
        f"no tilewright target for CUDA compute capability {major}.{minor}{part}: kernels are "
        f"built per architecture (an arch-specific 'a' cubin loads only on its own capability) "
        f"and tuned to the chip's figures, so no other chip's target is borrowed. Known: "
        f"{known}. torch.compile(backend='tilewright') runs this device's kernels on ATen "
        f"(tilewright.kernels.gemm raises this error); to generate kernels for it, add a "
        f"Target for sm_{major}{minor} to tilewright/runtime/targets.py and CUDA_CAPABILITIES")


def detect_target(device: torch.device | str) -> Target:
    """The target for the device a tensor lives on.

    CUDA devices map by exact compute capability (``CUDA_CAPABILITIES``: 8.0 → sm_80, 8.9 →
    sm_89, 9.0 → sm_90a, 10.0 → sm_100a, 10.3 → sm_103a, 11.0 → sm_110a, 12.0 → sm_120,
    12.1 → sm_121), ROCm devices by ``gcnArchName``.

    Raises:
        UnknownTargetError: a GPU this registry does not describe (see :func:`cuda_target`).
    """
    device = torch.device(device)
    if device.type == "cpu":
        return TARGETS["cpu"]
    if device.type in ("mps", "xpu"):
        return TARGETS[device.type]
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        if getattr(torch.version, "hip", None):
            arch = props.gcnArchName.split(":")[0]
            return get_target(f"hip:{arch}")
        return cuda_target(props.major, props.minor, props.name)
    raise UnknownTargetError(f"no target for device type {device.type!r}")


def host_target(backend: str) -> Target | None:
    """The target of ``backend`` whose kernels take this host's CPU tensors (``xpu`` ->
    ``xpu:opencl-cpu``), or None when that backend has none; ``config.cpu_target`` names one."""
    for t in TARGETS.values():
        if t.backend == backend and t.device_type == "cpu":
            return t
    return None


def host_backends() -> tuple[str, ...]:
    """The backends with a target whose kernels take this host's CPU tensors ("cpu", "xpu"),
    sorted: what ``config.cpu_target`` accepts."""
    return tuple(sorted({t.backend for t in TARGETS.values() if t.device_type == "cpu"}))


def triton_version() -> tuple[int, int]:
    """The installed triton's (major, minor)."""
    import triton

    major, minor = triton.__version__.split(".")[:2]
    return int(major), int(minor)


# Code generation that needs a minimum triton, measured on AOT builds (older versions fail to
# build, or compile but silently leave the engine unused, which the instruction checks catch):
#   gfx1250: triton 3.6 emits no v_wmma for tl.dot and no tensor_load_to_lds for descriptors,
#   and cannot compile the Gluon TDM GEMM; 3.9 does all three.
#   sm_110a: triton 3.6's bundled ptxas (CUDA 12.9) refuses the arch ("Value 'sm_110a' is not
#   defined for option 'gpu-name'"); 3.8's (CUDA 13.3) builds it (3.7 not measured).
MIN_TRITON = {
    "hip:gfx1250": ((3, 9), "does not generate gfx1250's matrix and data-mover instructions"),
    "cuda:sm_110a": ((3, 8), "bundles a ptxas (CUDA 12.9) that does not know sm_110a"),
}
# the same for one capability of a target (a Target feature name): the rest of the target builds
#   sm_121 fp8: triton 3.6 builds the fp8 GEMMs without the e4m3 mma.sync the chip has (it
#   upcasts); 3.8 emits it, as it does for sm_120 (measured on AOT builds, 3.7 not measured)
MIN_TRITON_FEATURES = {
    ("cuda:sm_121", "fp8_e4m3"): ((3, 8), "does not emit sm_121's e4m3 mma.sync (fp8 would run upcast)"),
}


def _too_old(need: tuple[int, int], why: str) -> str | None:
    have = triton_version()
    if have >= need:
        return None
    return f"triton {have[0]}.{have[1]} {why}; needs triton >= {need[0]}.{need[1]}"


def triton_can_target(target: Target, feature: str | None = None) -> str | None:
    """Why the installed triton cannot generate proper code for ``target`` (None if it can).

    Args:
        feature: also ask about this capability of the target (a :data:`FEATURES` name such as
            "fp8_e4m3"): a triton may build a target but not use one of its engines.

    Returns: the reason (names the installed and the needed triton version), or None.
    """
    if target.name in MIN_TRITON and (why := _too_old(*MIN_TRITON[target.name])):
        return why
    if feature is not None and (target.name, feature) in MIN_TRITON_FEATURES:
        return _too_old(*MIN_TRITON_FEATURES[(target.name, feature)])
    return None
