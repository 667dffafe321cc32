"""``helion_template``: a Helion kernel written anywhere becomes a tilewright template.

    from tilewright.templates.helion import helion_template

    TEMPLATE = helion_template(my_kernel, op="gemm", supports=my_supports)

(``tilewright.helion_template`` is the same function, imported when first used.)

``supports(problem, target)`` says which problems the kernel computes exactly and how to call
it for one: ``Support(False, reason)``, ``SUPPORTED`` (the kind's own argument order: GEMM
``(a, b, e0, ..., out)``, loop kernels ``(in0, ..., out0, ...)``), or a
:class:`~tilewright.templates.helion.calls.HelionCall` of argument expressions. The knobs are
the kind's, mapped to Helion's config fields and checked against the bound kernel's config
spec: a GEMM's ``BLOCK_M``/``BLOCK_N``/``BLOCK_K``/``GROUP_M`` (its hl.tile dims in that order),
a row reduction's ``XBLOCK``/``PERSISTENT``/``RBLOCK``, a pointwise kernel's Helion fields by
position (``block_0`` .. ``block_3``, ...); ``num_warps``, ``num_stages``, ``indexing`` for all.
The kernel and ``supports`` must be module-level names of an importable module: tuning workers
and ``tilewright aot``'s compile workers import them by name.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import inspect
import textwrap
from pathlib import Path
from typing import Any, Callable

from tilewright.errors import RegistrationError
from tilewright.runtime.targets import Target
from tilewright.runtime.verify import InstructionCheck
from tilewright.templates.base import SUPPORTED, Support
from tilewright.templates.helion.base import HelionTemplate
from tilewright.templates.helion.calls import HelionCall, default_call
from tilewright.templates.helion.gemm import HelionGemm
from tilewright.templates.helion.rows import RowTemplate


class HelionKernelTemplate(HelionTemplate):
    """A template made by :func:`helion_template` (see the module docstring)."""

    def __init__(self, kernel: Callable[..., Any], op: str, supports: Callable[[Any, Target], Any], name: str,
                 instructions: Callable[[Any, Any, Target], list[InstructionCheck]] | None = None):
        self.kernel = kernel  # type: ignore[misc] - per instance: one class serves every user kernel
        self.op = op  # type: ignore[misc]
        self.id = f"helion.{name}"  # type: ignore[misc]
        self.supports_fn = supports
        self.instructions_fn = instructions

    def helion_call(self, problem: Any, target: Target) -> HelionCall | Support:
        answer = self.supports_fn(problem, target)
        if isinstance(answer, HelionCall):
            return answer
        if not isinstance(answer, Support):
            raise TypeError(f"{self.id}: supports() returned {type(answer).__name__}; return a Support "
                            "(SUPPORTED or Support(False, reason)) or a HelionCall")
        return default_call(problem) if answer else answer

    def expected_instructions(self, problem: Any, params: Any, target: Target) -> list[InstructionCheck]:
        """The checks of the kind's base (ISA; TMA/TDM with tensor descriptors; a GEMM's matrix
        instructions for its tile), plus ``instructions`` given to :func:`helion_template`."""
        checks = super().expected_instructions(problem, params, target)
        if self.instructions_fn is not None and not target.interpreted:
            checks += list(self.instructions_fn(problem, self.space.complete(params), target))
        return checks

    @functools.cached_property
    def source_hash(self) -> str:
        """The base hash and the file of ``supports`` (it decides what the kernel is called with)."""
        h = hashlib.sha256(HelionTemplate.source_hash.func(self).encode())  # type: ignore[attr-defined]
        path = Path(inspect.getfile(self.supports_fn))
        h.update(path.name.encode() + path.read_bytes())
        return h.hexdigest()[:16]

    def __reduce__(self):
        # by name: a Helion kernel object holds locks and caches that do not pickle
        instructions = _name_of(self.instructions_fn) if self.instructions_fn else None
        return (_rebuild, (_name_of(self.kernel), self.op, _name_of(self.supports_fn), self.id, instructions))


class HelionGemmKernel(HelionKernelTemplate, HelionGemm):
    """A user's GEMM kernel: the knobs, seeds and instruction checks of :class:`HelionGemm`
    (its first hl.tile dims are M and N, its inner one K)."""


class HelionRowKernel(HelionKernelTemplate, RowTemplate):
    """A user's row kernel (a reduction over the last dim): :class:`RowTemplate`'s knobs and
    seeds (its first hl.tile dim is the rows)."""


class HelionPointwiseKernel(HelionKernelTemplate):
    """A user's pointwise kernel: Helion's config fields by position (``block_0`` ..)."""

    def shape_seeds(self, problem: Any, target: Target) -> list[dict[str, Any]]:
        """Under the interpreter the largest blocks up to 64 (the fewest programs); on GPUs
        Helion's default with 8 warps, and with every block doubled."""
        spec = self.spec_or_none(problem, target)
        if spec is None:
            return []
        blocks = list(spec.default_config().config.get("block_sizes", []))[:4]
        if target.interpreted:
            return [{f"block_{i}": min(b.max_size, 64) for i, b in enumerate(list(spec.block_sizes)[:4])}]
        doubled = {f"block_{i}": min(spec.block_sizes[i].max_size, 2 * v) for i, v in enumerate(blocks)}
        return [{"num_warps": 8}, doubled]


KINDS = {"gemm": HelionGemmKernel, "reduction": HelionRowKernel, "pointwise": HelionPointwiseKernel}


def _name_of(obj: Any) -> tuple[str, str]:
    fn = getattr(obj, "fn", obj)
    return fn.__module__, getattr(obj, "__qualname__", None) or fn.__qualname__


def _lookup(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _rebuild(kernel: tuple[str, str], op: str, supports: tuple[str, str], template_id: str,
             instructions: tuple[str, str] | None) -> HelionKernelTemplate:
    from tilewright.templates import get_template

    try:
        return get_template(template_id)  # type: ignore[return-value]
    except KeyError:
        return KINDS[op](_lookup(*kernel), op, _lookup(*supports), template_id.split(".", 1)[1],
                                    _lookup(*instructions) if instructions else None)


def _returns_new_tensor(fn: Callable[..., Any]) -> str | None:
    """Why ``fn`` cannot follow the outputs-passed-in convention: it returns a value that is
    not one of its parameters (a tensor it allocates, as Helion's own examples do), or None.
    A function whose source cannot be read is not judged (its first check says so instead)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not defs:
        return None
    params = {a.arg for a in defs[0].args.posonlyargs + defs[0].args.args + defs[0].args.kwonlyargs}

    def returns(nodes: list[ast.AST]):
        for node in nodes:  # the kernel's own returns, not those of functions nested in it
            if isinstance(node, ast.Return):
                yield node
            elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                yield from returns(list(ast.iter_child_nodes(node)))

    for ret in returns(defs[0].body):
        value = ret.value
        if value is None or (isinstance(value, ast.Constant) and value.value is None):
            continue
        names = value.elts if isinstance(value, ast.Tuple) else [value]
        if all(isinstance(n, ast.Name) and n.id in params for n in names):
            continue  # returns what it was handed (written in place): harmless
        return f"returns `{ast.unparse(value)}` (line {ret.lineno} of its definition), not a tensor it was handed"
    return None


def helion_template(kernel: Callable[..., Any], *, op: str, supports: Callable[[Any, Target], Any],
                    name: str | None = None, register: bool = True,
                    instructions: Callable[[Any, Any, Target], list[InstructionCheck]] | None = None
                    ) -> HelionKernelTemplate:
    """Make (and, by default, register) a template of a Helion kernel.

    Args:
        kernel: a ``@helion.kernel`` function (or the plain function); tilewright binds it
            with its own settings (static shapes unless the problem is dynamic; the dot
            precision of the target) and never runs Helion's autotuner.
        op: the problem kind it serves: "gemm", "pointwise" or "reduction".
        supports: ``(problem, target) -> Support | HelionCall`` (see the module docstring):
            accept only the problems the kernel computes exactly.
        name: the template id's name part (``helion.<name>``); default: the kernel's name.
        instructions: ``(problem, params, target) -> [InstructionCheck]``, what ``tilewright
            aot`` artifacts must contain beyond the ISA (default for GEMMs: the matrix
            instructions of the tile; else nothing more).
        register: register it (:func:`tilewright.register_template`).

    Raises:
        RegistrationError: an op Helion templates do not serve, a kernel or ``supports`` that
            is not a module-level name, or what registration refuses.
    """
    if op not in KINDS:
        raise RegistrationError(f"helion_template: op {op!r}; Helion templates serve {', '.join(KINDS)}")
    fn = getattr(kernel, "fn", kernel)
    for what, obj in (("kernel", fn), ("supports", supports)) + ((("instructions", instructions),) if instructions else ()):
        if not callable(obj) or "<locals>" in getattr(obj, "__qualname__", "<locals>"):
            raise RegistrationError(f"helion_template: the {what} must be a module-level function "
                                    f"(worker processes import it by name), got {obj!r}")
    if (why := _returns_new_tensor(fn)) is not None:
        raise RegistrationError(f"helion_template: kernel {fn.__qualname__} {why}; tilewright passes the "
                                "outputs in and reads them after the call (GEMM: the last argument `out`, loop "
                                "kernels: `out0, ...`, or your HelionCall's names), so what the kernel returns is "
                                "never seen: take the output as a parameter, write `out[tile_m, tile_n] = ...` "
                                "into it, and return nothing")
    template = KINDS[op](kernel, op, supports, name or fn.__name__, instructions)
    if register:
        from tilewright.templates import register_template

        register_template(template)
    return template


__all__ = ["HelionKernelTemplate", "SUPPORTED", "Support", "helion_template"]
