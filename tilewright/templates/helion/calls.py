"""How a Helion kernel is called for a problem: the arguments, as Python expressions over the
names of a problem kind's launcher, and those launchers.

A :class:`HelionCall` lists the kernel's positional arguments as expressions (``"in1"``,
``"out0"``, ``"1e-06"``, ``"_tw_epilogue(STEPS, e0)"``). The same expressions are evaluated
twice: when rendering, over meta tensors laid out as the problem says (Helion binds to them and
reads its config spec from them), and in the rendered module's ``launch``, over the real
tensors. One description, so what Helion compiled for is what runs.

An :class:`Interface` is a problem kind's launcher: its signature (the names the expressions
may use), the meta tensors behind them, how outputs are allocated, and the guards a
static-shape kernel needs (Helion bakes sizes and strides into it: a tensor of another layout
is copied to the kernel's and an output copied back, so a layout the trace did not see costs a
copy, never a wrong read).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from tilewright.ir import dtypes
from tilewright.ir.index import code, static_or_hint
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import DTYPES, LoopProblem


@dataclass(frozen=True)
class HelionCall:
    """A Helion kernel's arguments for one problem.

    Attributes:
        args: one Python expression per positional parameter of the kernel, over the names
            of the problem kind's launcher (GEMM: ``a``, ``b``, ``out``, ``e0``, ``e1``, ...,
            ``M``, ``N``, ``K``; loop kernels: ``in0``, ``in1``, ..., ``out0``, ..., and the
            size symbols ``z0``, ...). Outputs are passed in: the kernel writes them (a kernel
            that allocated its own would hide an element it forgot behind fresh memory).
        imports: ``from module import name`` lines the expressions need (a helper that
            builds a closure, say); the module must be importable in a fresh process.
    """

    args: tuple[str, ...]
    imports: tuple[str, ...] = ()


def evaluate(call: HelionCall, names: Mapping[str, Any]) -> list[Any]:
    """``call``'s argument expressions over ``names`` (its imports run first)."""
    env = dict(names)
    for line in call.imports:
        exec(line, env)  # noqa: S102 - the template's own import lines
    return [eval(expr, env) for expr in call.args]  # noqa: S307 - the template's own expressions


def default_call(problem: Any) -> HelionCall:
    """The kind's own order: GEMM ``(a, b, e0, ..., out)``; loop kernels ``(in0, ..., out0, ...)``."""
    if isinstance(problem, GemmProblem):
        return HelionCall(("a", "b", *(f"e{i}" for i in range(len(problem.epilogue_inputs))), "out"))
    k = problem.kernel
    return HelionCall(tuple(b.name for b in k.inputs + k.outputs))


def _meta(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(shape, stride, dtype=dtype, device="meta")


def conform(template: str, name: str, t: torch.Tensor, shape: tuple, stride: tuple) -> torch.Tensor:
    """``t`` laid out as a static-shape kernel was built for: itself when its strides are those,
    else a copy with those strides (a padded row, a transposed view: correct, one copy slower).

    Raises:
        ValueError: another shape (the kernel computes a different problem), naming it.
    """
    if tuple(t.shape) != shape:
        raise ValueError(f"{template}: {name} is {tuple(t.shape)}; this static-shape Helion kernel was "
                         f"built for {shape} (tilewright renders one per problem)")
    if t.stride() == stride:
        return t
    return torch.empty_strided(shape, stride, dtype=t.dtype, device=t.device).copy_(t)


def _conform(env: Mapping[str, Any], inputs: list[str], outputs: list[str]) -> tuple[str, str]:
    """Launcher lines that conform the tensors before the call, and copy outputs back after."""
    before = "".join(f"    {n} = conform(TEMPLATE, {n!r}, {n}, {tuple(env[n].shape)}, {tuple(env[n].stride())})\n"
                     for n in inputs)
    before += "".join(f"    {n}_given, {n} = {n}, conform(TEMPLATE, {n!r}, {n}, {tuple(env[n].shape)}, "
                      f"{tuple(env[n].stride())})\n" for n in outputs)
    after = "".join(f"    if {n} is not {n}_given:\n        {n}_given.copy_({n})\n" for n in outputs)
    return before, after


class Interface:
    """A problem kind's launcher, as a Helion template renders it (see the module docstring)."""

    def names(self, problem: Any) -> dict[str, Any]:
        """The launcher's names with meta tensors or ints as the problem lays them out."""
        raise NotImplementedError

    def launch_code(self, problem: Any, host: str, call: HelionCall, static: bool) -> str:
        """``def launch(...)``: allocate outputs, check a static kernel's layouts, call the
        Helion host function ``host`` with ``call``'s arguments, return the outputs."""
        raise NotImplementedError


def _layout(rows: int, cols: int, layout: str) -> tuple[int, int]:
    return (cols, 1) if layout == "row" else (1, rows)


class GemmInterface(Interface):
    """``launch(a, b, *epilogue_inputs, out=None)`` for a 2-D :class:`GemmProblem`: ``a`` is
    (M, K), ``b`` (K, N), both in the problem's layouts; epilogue inputs arrive broadcast to
    (M, N) and are passed as (M, N) views of their real values made contiguous (stride 0
    along the broadcast dims), so a static kernel's baked strides hold for every caller."""

    def names(self, problem: GemmProblem) -> dict[str, Any]:
        p = problem
        env: dict[str, Any] = {"M": p.M, "N": p.N, "K": p.K,
                               "a": _meta((p.M, p.K), _layout(p.M, p.K, p.layout_a), DTYPES[p.dtype]),
                               "b": _meta((p.K, p.N), (p.N, 1) if p.layout_b == "row" else (1, p.K), DTYPES[p.dtype]),
                               "out": _meta((p.M, p.N), (p.N, 1), DTYPES[p.out_dtype])}
        for i, e in enumerate(p.epilogue_inputs):
            env[f"e{i}"] = _meta((p.M, p.N), compact_stride(e.broadcast, p.M, p.N), DTYPES[e.dtype])
        return env

    def launch_code(self, problem: GemmProblem, host: str, call: HelionCall, static: bool) -> str:
        p = problem
        n = len(p.epilogue_inputs)
        lines = ["def launch(a, b, *epilogue_inputs, out=None):",
                 '    """out = epilogue(a @ b); a (M, K), b (K, N), epilogue inputs broadcast to (M, N)."""',
                 "    M, K = a.shape", "    N = b.shape[1]"]
        if n:
            patterns = tuple(e.broadcast for e in p.epilogue_inputs)
            lines.append(f"    {', '.join(f'e{i}' for i in range(n))}, = "
                         f"(compact(e, pattern) for e, pattern in zip(epilogue_inputs, {patterns!r}))")
        lines.append(f"    if out is None:\n        out = torch.empty((M, N), dtype={DTYPES[p.out_dtype]}, device=a.device)")
        code_ = "\n".join(lines) + "\n"
        before, after = _conform(self.names(p), ["a", "b"], ["out"]) if static else ("", "")
        code_ += before + f"    {host}({', '.join(call.args)}, _launcher=_tw_launcher)\n" + after
        return code_ + ("    return out_given\n" if static else "    return out\n")


def compact_stride(broadcast: str, M: int, N: int) -> tuple[int, int]:
    """Strides of an epilogue input's (M, N) view over its contiguous real values."""
    row = (N if "N" in broadcast else 1) if "M" in broadcast else 0
    return row, 1 if "N" in broadcast else 0


def compact(e: torch.Tensor, broadcast: str) -> torch.Tensor:
    """``e`` (broadcast to (M, N)) as an (M, N) view of its real values, contiguous (a copy only
    when they are not already): the layout :class:`GemmInterface` binds static kernels to."""
    M, N = e.shape[-2:]
    real = e[:, :1] if "N" not in broadcast else e
    real = real[:1] if "M" not in broadcast else real
    return real.contiguous().expand(M, N)


class LoopInterface(Interface):
    """``launch(in0, ..., z0, ..., outs=None)`` for a :class:`LoopProblem` (the inputs, then the
    values of its size symbols; outputs allocated in the kernel's layouts when not given)."""

    def names(self, problem: LoopProblem) -> dict[str, Any]:
        sizes = problem.size_map
        env: dict[str, Any] = {s.name: static_or_hint(s, sizes) for s in problem.kernel.size_symbols()}
        for b in problem.kernel.inputs + problem.kernel.outputs:
            shape = tuple(static_or_hint(s, sizes) for s in b.shape)
            stride = tuple(static_or_hint(s, sizes) for s in b.stride)
            env[b.name] = _meta(shape, stride, dtypes.TORCH[b.dtype])
        return env

    def launch_code(self, problem: LoopProblem, host: str, call: HelionCall, static: bool) -> str:
        k = problem.kernel
        sizes = [s.name for s in k.size_symbols()]
        ins, outs = [b.name for b in k.inputs], [b.name for b in k.outputs]
        head = ", ".join(ins + sizes + ["outs=None"])
        code_ = [f"def launch({head}):",
                 '    """The kernel on tensors: inputs, then the size symbols; returns the outputs."""']
        code_ += [f"    {s} = int({s})" for s in sizes]
        device = f"{ins[0]}.device" if ins else "'cpu'"
        allocs = "".join(
            f"            torch.empty_strided(({''.join(code(s) + ', ' for s in b.shape)}), "
            f"({''.join(code(s) + ', ' for s in b.stride)}), dtype={dtypes.TORCH[b.dtype]}, device={device}),\n"
            for b in k.outputs)
        code_.append(f"    if outs is None:\n        outs = (\n{allocs}        )")
        code_.append(f"    {', '.join(outs)}, = outs")
        text = "\n".join(code_) + "\n"
        before, after = _conform(self.names(problem), ins, outs) if static else ("", "")
        text += before + f"    {host}({', '.join(call.args)}, _launcher=_tw_launcher)\n" + after
        return text + "    return outs\n"


def interface_for(problem: Any) -> Interface:
    """The launcher a problem's kind uses.

    Raises:
        TypeError: a problem kind Helion templates do not serve yet.
    """
    if isinstance(problem, GemmProblem):
        return GemmInterface()
    if isinstance(problem, LoopProblem):
        return LoopInterface()
    raise TypeError(f"Helion templates serve GEMMs and loop kernels, not {type(problem).__name__}")
