"""Registers, spills and scratch of a compiled kernel, read from its artifacts.

* NVIDIA (cubin + PTX, Triton's and CuTeDSL's alike): the bundled ``cuobjdump
  --dump-resource-usage`` gives registers per thread, stack (local memory) and static shared
  memory at once; when the stack is not empty the bundled ``ptxas -v`` is run again on the PTX
  for the exact spill stores and loads (a stack frame can hold local arrays as well as spills).
  Triton's own ptxas run prints the same numbers but discards them.
* AMD (the ``.amdgcn`` assembly Triton, Gluon and FlyDSL write): the HSA kernel metadata at
  its end, ``.vgpr_count`` (AGPRs included on CDNA), ``.sgpr_count``, ``.vgpr_spill_count``,
  ``.sgpr_spill_count`` and ``.private_segment_fixed_size`` (scratch bytes per work-item).

Facts measured with triton 3.9 (2026-12): the demo Llama's 48x128x256 decode GEMM as
``triton.gemm`` 16x32x256 with one warp compiles on sm_100a to 64 registers, a 5000-byte stack
frame, 8508 bytes of spill stores; on gfx950 to 512 VGPRs with 310 spilled (644 B scratch); on
gfx1250 to 1024 VGPRs with 410 spilled (908 B scratch).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping


@dataclass(frozen=True)
class Resources:
    """What one compiled kernel uses per thread (work-item).

    Attributes:
        registers: NVIDIA registers per thread; AMD VGPRs (AGPRs included where the chip has
            them); None when unknown.
        sgprs: AMD scalar registers (None on NVIDIA).
        spill_stores, spill_loads: NVIDIA bytes of spill stores/loads per thread (ptxas).
        vgpr_spills, sgpr_spills: AMD registers spilled.
        stack: bytes of stack frame (NVIDIA) or private segment/scratch (AMD) per thread.
        shared: static shared memory / LDS bytes, where the artifact records it.
        source: where the numbers came from ("cuobjdump", "ptxas", "amdgcn").
    """

    registers: int | None = None
    sgprs: int | None = None
    spill_stores: int = 0
    spill_loads: int = 0
    vgpr_spills: int = 0
    sgpr_spills: int = 0
    stack: int = 0
    shared: int | None = None
    source: str = ""

    @property
    def spills(self) -> bool:
        """Whether the register allocator spilled to memory: NVIDIA spill stores or loads, AMD
        VGPR spills, or AMD SGPR spills with scratch in use (SGPRs otherwise spill into VGPR
        lanes, which costs no memory traffic; measured on gfx1250's NVFP4 dequantising GEMM)."""
        return bool(self.spill_stores or self.spill_loads or self.vgpr_spills
                    or (self.sgpr_spills and self.stack))

    def describe(self) -> str:
        """"168 regs" / "64 regs, 8508 B spill stores" / "512 vgprs, 310 spilled"."""
        if self.registers is None:
            return "unknown"
        if self.sgprs is not None:
            text = f"{self.registers} vgprs"
            if self.vgpr_spills or self.sgpr_spills:
                text += f", {self.vgpr_spills} vgprs + {self.sgpr_spills} sgprs spilled"
        else:
            text = f"{self.registers} regs"
            if self.spill_stores or self.spill_loads:
                text += f", {self.spill_stores} B spill stores, {self.spill_loads} B spill loads"
        return text + (f", {self.stack} B stack" if self.stack else "")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "spills": self.spills}


def _nvidia_tool(name: str) -> str | None:
    """A CUDA tool bundled with triton (``ptxas``, ``ptxas-blackwell``, ``cuobjdump``), else on PATH."""
    try:
        import triton

        path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
        if path.is_file():
            return str(path)
    except ImportError:
        pass
    return shutil.which(name)


def _ptx_arch(ptx: str) -> str | None:
    m = re.search(r"^\s*\.target\s+(sm_\w+)", ptx, re.M)
    return m.group(1) if m else None


def parse_cuobjdump(text: str) -> dict[str, dict[str, int]]:
    """``cuobjdump --dump-resource-usage`` output → per function {"REG": .., "STACK": .., ...}."""
    out: dict[str, dict[str, int]] = {}
    for name, fields in re.findall(r"Function\s+(\S+?):\s*\n\s*(.*)", text):
        out[name] = {k: int(v) for k, v in re.findall(r"(\w+(?:\[\d+\])?):(\d+)", fields)}
    return out


def parse_ptxas(text: str) -> dict[str, dict[str, int]]:
    """``ptxas -v`` output → per entry {"registers", "stack", "spill_stores", "spill_loads"}."""
    out: dict[str, dict[str, int]] = {}
    current = None
    for line in text.splitlines():
        if m := re.search(r"(?:Compiling entry function|Function properties for) '?(\w+)'?", line):
            current = m.group(1)
            out.setdefault(current, {})
        if current is None:
            continue
        if m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            out[current].update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        if m := re.search(r"Used (\d+) registers", line):
            out[current]["registers"] = int(m.group(1))
    return out


def ptxas_spills(ptx_path: Path) -> dict[str, dict[str, int]]:
    """Run the bundled ptxas with ``-v`` on a PTX file (for its target) and parse what it says.
    Empty when no ptxas is found or it fails."""
    ptx = ptx_path.read_text(errors="replace")
    arch = _ptx_arch(ptx)
    if arch is None:
        return {}
    digits = re.match(r"sm_(\d+)", arch)
    cc = int(digits.group(1)) if digits else 90
    # the ptxas triton itself runs for this arch (triton 3.9: the newer one from sm_90 on)
    tool = _nvidia_tool("ptxas-blackwell" if cc >= 90 else "ptxas")
    if tool is None or not Path(tool).exists():
        tool = _nvidia_tool("ptxas")
    if tool is None:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            run = subprocess.run([tool, "-v", f"--gpu-name={arch}", str(ptx_path), "-o", f"{tmp}/k.o"],
                                 capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired):
            return {}
    return parse_ptxas(run.stderr + run.stdout) if run.returncode == 0 else {}


def nvidia_resources(cubin: Path, ptx: Path | None = None) -> Resources | None:
    """Resources of the kernel in ``cubin`` (the entry with the most registers when there are
    several); spill bytes from ``ptxas -v`` on ``ptx`` when the kernel has a stack frame."""
    tool = _nvidia_tool("cuobjdump")
    if tool is None:
        return None
    try:
        run = subprocess.run([tool, "--dump-resource-usage", str(cubin)], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    usage = parse_cuobjdump(run.stdout)
    if not usage:
        return None
    name, u = max(usage.items(), key=lambda item: (item[1].get("REG", 0), item[1].get("STACK", 0)))
    res = Resources(registers=u.get("REG"), stack=u.get("STACK", 0) + u.get("LOCAL", 0),
                    shared=u.get("SHARED"), source="cuobjdump")
    if res.stack and ptx is not None and ptx.is_file():
        found = ptxas_spills(ptx)
        entry = found.get(name) or (max(found.values(), key=lambda d: d.get("spill_stores", 0)) if found else {})
        if entry:
            res = Resources(registers=entry.get("registers", res.registers), stack=entry.get("stack", res.stack),
                            spill_stores=entry.get("spill_stores", 0), spill_loads=entry.get("spill_loads", 0),
                            shared=res.shared, source="ptxas")
    return res


def parse_amdgcn(text: str) -> Resources | None:
    """Resources from the HSA metadata of an ``.amdgcn`` file (the kernel with the most VGPRs)."""
    kernels = re.split(r"^\s*- \.agpr_count:|^\s*-\s+\.args:", text, flags=re.M)
    best: Resources | None = None
    for chunk in kernels[1:] or [text]:
        def field(key: str) -> int | None:
            m = re.search(rf"^\s*\.{key}:\s*(\d+)", chunk, re.M)
            return int(m.group(1)) if m else None

        vgprs = field("vgpr_count")
        if vgprs is None:
            continue
        res = Resources(registers=vgprs, sgprs=field("sgpr_count"), vgpr_spills=field("vgpr_spill_count") or 0,
                        sgpr_spills=field("sgpr_spill_count") or 0,
                        stack=field("private_segment_fixed_size") or 0,
                        shared=field("group_segment_fixed_size"), source="amdgcn")
        if best is None or (res.registers, res.vgpr_spills) > (best.registers, best.vgpr_spills):
            best = res
    return best


def read_resources(artifacts: Mapping[str, Path]) -> Resources | None:
    """Resources of a built kernel from its artifacts (stage → path: "cubin"/"ptx" for NVIDIA,
    "amdgcn" for AMD); None where there is nothing to read (Metal, SYCL, a failed build)."""
    if "cubin" in artifacts:
        return nvidia_resources(Path(artifacts["cubin"]), Path(artifacts["ptx"]) if "ptx" in artifacts else None)
    if "amdgcn" in artifacts:
        return parse_amdgcn(Path(artifacts["amdgcn"]).read_text(errors="replace"))
    return None
