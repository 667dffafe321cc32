"""PDL in the Triton templates: the ``PDL`` knob every Triton GEMM and loop template has, what it
renders, when it is legal and what the compiled kernel must then contain.

``PDL=True`` renders ``gdc_wait()`` before the kernel's first global access (loads of produced
inputs, stores that may overwrite what the previous kernel still reads, device-side descriptor
writes), ``gdc_launch_dependents()`` once its inputs are read (a GEMM: after its K loop; a loop
kernel: before its first store), and launches the kernel with ``launch_pdl=True``. The knob is
not tuned per kernel: the autotuner measures kernels one at a time, where PDL changes nothing.
Whether a kernel and the one before it overlap is an *edge* decision of the compiled graph
(:mod:`tilewright.compiler.pdl`), which sets the knob on both ends of each chosen edge.
"""

from __future__ import annotations

from tilewright._config import config
from tilewright.runtime.pdl import PDL_DOC, triton_pdl_refusal
from tilewright.runtime.targets import Target
from tilewright.templates.base import InstructionCheck, Knob, Params

PDL_KNOB = Knob("PDL", (False, True), False, PDL_DOC)
GDC = (r"griddepcontrol\.wait", r"griddepcontrol\.launch_dependents")
GDC_IMPORT = "from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait"


def pdl_refusal(params: Params, target: Target) -> str | None:
    """Why ``PDL=True`` cannot be rendered for ``target`` (None when it can, or PDL is off)."""
    if not params.get("PDL"):
        return None
    if config.pdl == "off":
        return "TILEWRIGHT_PDL=off rules out PDL=True"
    return triton_pdl_refusal(target)


def pdl_checks(params: Params, target: Target) -> list[InstructionCheck]:
    """A PDL kernel waits and releases; a kernel without PDL has neither instruction (CUDA only:
    other targets have no griddepcontrol)."""
    if target.backend != "cuda":
        return []
    if params.get("PDL"):
        return [InstructionCheck("ptx", GDC, (), "programmatic dependent launch (PDL=True)")]
    return [InstructionCheck("ptx", (), GDC, "a kernel without PDL (PDL=False)")]


def signal_before_stores(lines: list[str]) -> list[str]:
    """A loop kernel's body with ``gdc_launch_dependents()`` before its first top-level store
    (after the last one when none is at top level: a looped reduction stores inside its loop)."""
    for i, line in enumerate(lines):
        if line.startswith("tl.store("):
            return lines[:i] + ["gdc_launch_dependents()"] + lines[i:]
    return lines + ["gdc_launch_dependents()"]
