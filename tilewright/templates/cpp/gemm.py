"""``cpp.gemm``: a GEMM with its epilogue on the CPU as ATen's product (``torch.matmul``, MKL or
oneDNN underneath) followed by the whole epilogue in one generated C++ pass over the output.

The ATen candidate runs an epilogue as one PyTorch operator per step (a SiLU·mul is five passes
over the output, each allocating); here the epilogue, :func:`~tilewright.ir.epilogue.
problem_epilogue`'s IR with ``acc`` read from the product, is a pointwise loop kernel of this
folder's emitter (vectorised, one pass, written straight into the output). Epilogue inputs
arrive expanded to the output's shape (the caller's broadcast views, stride 0 where they
broadcast): the kernel reads them through their strides, and specialises the layout their
pattern implies (a bias ``N`` as strides ``(0, 1)``).

Refused, with the reason: problems without an epilogue (ATen's is the same kernel), block-scaled
and fp8 operands, and problems that also store the product (``store_acc``).
"""

from __future__ import annotations

from typing import Any

import sympy

from tilewright.ir import expr as E
from tilewright.ir.epilogue import problem_epilogue
from tilewright.ir.index import contiguous_strides, variables
from tilewright.ir.kernel import Buffer, LoopKernel, Store, size_symbol
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import DTYPES
from tilewright.runtime.targets import Target
from tilewright.templates.base import SUPPORTED, RenderedKernel, Support, TemplateSpec
from tilewright.templates.cpp.source import source_context


def epilogue_kernel(problem: GemmProblem) -> LoopKernel:
    """The epilogue as a pointwise loop kernel over the output, ``(batch, M, N)`` or ``(M, N)``:
    ``in0`` the product (in the operands' dtype, as ``torch.matmul`` returns it), ``in{k+1}``
    epilogue input ``k`` expanded to the output's shape, ``out0`` the result."""
    dims = ("b", "m", "n") if problem.batched else ("m", "n")
    ranges = tuple(size_symbol(i) for i in range(len(dims)))
    xs = variables("x", len(dims))
    full = contiguous_strides(ranges)
    product = DTYPES_NAME.get(problem.dtype, "fp32")
    inputs = [Buffer("in0", product, ranges, full)]
    for k, e in enumerate(problem.epilogue_inputs):
        # the expanded view's strides: 0 along the dims the input does not span
        spans = [d.upper() in e.broadcast for d in dims]
        own = contiguous_strides(tuple(r for r, s in zip(ranges, spans) if s))
        it = iter(own)
        inputs.append(Buffer(f"in{k + 1}", e.dtype, ranges,
                             tuple(next(it) if s else sympy.Integer(0) for s in spans)))

    def fn(n: E.Node, src: tuple[E.Node, ...]) -> E.Node | None:
        if n.op == "acc":
            return E.cast(E.load("in0", xs, product), "fp32")
        if n.op == "load":
            k = int(n.arg[0][1:])
            return E.load(f"in{k + 1}", xs, n.dtype)
        return None

    value = E.rewrite([problem_epilogue(problem)], fn)[0]
    value = E.cast(value, problem.out_dtype) if problem.out_dtype != value.dtype else value
    out = Buffer("out0", problem.out_dtype, ranges, full)
    return LoopKernel(ranges, (), tuple(inputs), (out,), (Store("out0", xs, value),))


DTYPES_NAME = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "fp64": "fp64"}


class CppGemm(TemplateSpec):
    """ATen's product, then the epilogue as one vectorised C++ pass (see the module docstring)."""

    id = "cpp.gemm"
    backend = "cpp"
    op = "gemm"
    jinja = "gemm.py.jinja"

    def offered_on_cpu(self, problem: GemmProblem) -> bool:
        """Whether the GEMM policy offers it on the cpu target without a forced backend: for
        16-bit operands whose epilogue oneDNN cannot fuse (``cpp.gemm_onednn``), where ATen's
        epilogue pays a cast pass each way besides its steps (Llama's SwiGLU gate, silu·mul,
        bf16: 77 against 98 us at 32x256x128, 274 against 320 us at 64x1024x256, one thread;
        fp32 ties, so a C++ build per epilogue is not spent there)."""
        from tilewright.templates.cpp.gemm_onednn import onednn_plan

        return problem.dtype in ("bf16", "fp16") and isinstance(onednn_plan(problem), str)

    def problem_support(self, problem: Any, target: Target) -> Support:
        if not isinstance(problem, GemmProblem):
            return Support(False, "cpp.gemm runs GEMM problems")
        if target.backend != "cpu":
            return Support(False, f"cpp.gemm is for the cpu target, not {target.name}")
        if not (problem.epilogue or problem.epilogue_ir):
            return Support(False, "no epilogue: ATen's GEMM is the same kernel")
        if problem.block_scaled or problem.dtype not in DTYPES_NAME:
            return Support(False, f"{problem.dtype} operands: the product is ATen's alone")
        if problem.store_acc:
            return Support(False, "a GEMM that also stores its product runs on ATen")
        return SUPPORTED

    def seed_params(self, problem: GemmProblem, target: Target) -> list[dict[str, Any]]:
        return [{}]

    def render_kernel(self, problem: GemmProblem, params: dict[str, Any], target: Target) -> RenderedKernel:
        kernel = epilogue_kernel(problem)
        sizes = [s.name for s in kernel.size_symbols()]
        source = self.render_jinja(
            problem_text=problem.describe(), target=target.name, name="cpp_gemm", sizes=sizes,
            batched=problem.batched, n_inputs=len(problem.epilogue_inputs),
            out_dtype=str(DTYPES[problem.out_dtype]), block=65536, op=problem.describe().replace('"', "'"),
            **source_context(kernel, False))
        return RenderedKernel(template_id=self.id, params={}, target=target.name, source=source,
                              name="cpp_gemm", meta={"kind": "gemm", "language": "cpp"})


__all__ = ["CppGemm", "epilogue_kernel"]
