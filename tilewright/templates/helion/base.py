"""A template that is a Helion kernel (``@helion.kernel``, pytorch/helion).

Helion writes a kernel once as PyTorch-like Python over tiles; for a *config* (block sizes,
reduction loops, warps, stages, indexing, program ids) it generates Triton. A
:class:`HelionTemplate` puts that generation where tilewright's jinja rendering would be:

* **parameters**: knobs with field-standard names (``XBLOCK``/``RBLOCK``/``PERSISTENT`` for row
  kernels, ``BLOCK_M``/``BLOCK_N``/``BLOCK_K``/``GROUP_M`` for GEMMs, ``num_warps``,
  ``num_stages``, ``indexing``), each mapped to a field of Helion's ``Config``
  (:attr:`HelionTemplate.fields`). The legal values are the bound kernel's config spec's
  (``bound.config_spec``: each block's min/max, which loops reduce); seeds are the spec's
  default config plus the policies' shape rules. Helion's autotuner is never run: tilewright's
  tuner measures.
* **rendering**: the problem's :class:`~tilewright.templates.helion.calls.HelionCall` evaluated
  over meta tensors, ``kernel.bind(args)``, ``bound.to_triton_code(config)``, then a ``launch``
  the kind's interface writes. For the interpreter (``cpu``) the module is rewritten by
  :mod:`~tilewright.templates.helion.interpret`; for GPUs it is Helion's text, and its
  :class:`~tilewright.runtime.aot.AotSpec` is read off a recorded call of Helion's host code.
* **identity**: the cache key's source hash covers the template's modules, the kernel's own
  module and Helion's version (:attr:`HelionTemplate.source_hash`).

Code generation costs about a second per (problem, config); bound kernels and generated text
are kept per process (:data:`_GENERATED`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import importlib.metadata
import inspect
import threading
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping

import torch

from tilewright._config import config as tw_config
from tilewright.ir import dtypes
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.runtime.aot import AotSpec
from tilewright.runtime.targets import Target
from tilewright.runtime.verify import InstructionCheck
from tilewright.templates.base import SUPPORTED, Knob, ParamSpace, RenderedKernel, Support, TemplateSpec
from tilewright.templates.helion.calls import HelionCall, evaluate, interface_for
from tilewright.templates.triton.emit import POINTER

BLOCKS = (0,) + tuple(1 << i for i in range(13))  # 0: Helion's default for that block

# knobs every Helion template can use; a template maps the ones it has to Config fields
COMMON_KNOBS = (
    Knob("num_warps", (1, 2, 4, 8, 16, 32), 4, "warps per program"),
    Knob("num_stages", (1, 2, 3, 4, 5), 1, "software-pipeline depth of the kernel's loops"),
    Knob("indexing", ("pointer", "block_ptr", "tensor_descriptor"), "pointer",
         "how loads and stores address memory: tensor_descriptor is TMA (sm_90a+) or TDM (gfx1250)"),
)
# the generic space of a Helion kernel registered from outside (helion_template): Helion's
# own config names, blocks by position
GENERIC_SPACE = ParamSpace(tuple(Knob(f"block_{i}", BLOCKS, 0, f"block size of the kernel's hl.tile dim {i} "
                                      "(0: Helion's default)") for i in range(4))
                           + (Knob("reduction_loop", BLOCKS, 0, "0: persistent rows; else the looped "
                                   "reduction's block"),
                              Knob("l2_grouping", (1, 2, 4, 8, 16, 32, 64), 1, "programs per L2 swizzle group"))
                           + COMMON_KNOBS)
GENERIC_FIELDS: Mapping[str, tuple[str, int | None]] = {
    **{f"block_{i}": ("block_sizes", i) for i in range(4)}, "reduction_loop": ("reduction_loops", 0),
    "l2_grouping": ("l2_groupings", 0), "num_warps": ("num_warps", None),
    "num_stages": ("num_stages", None), "indexing": ("indexing", None)}


def helion_version() -> str:
    try:
        return importlib.metadata.version("helion")
    except importlib.metadata.PackageNotFoundError:
        return ""


log = logging.getLogger("tilewright.templates.helion")
_lock = threading.RLock()
# (template id, problem hash, settings) -> (bound kernel, its arguments);
# (..., config, target) -> generated source
_BOUND: dict[tuple, Any] = {}
_GENERATED: dict[tuple, str] = {}


def with_helion_language(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with ``helion.language`` as its module's global ``hl``, imported now.

    The package's Helion kernels leave ``hl`` unset when their module is imported: registering
    them must not import Helion, which takes about 2.4 s (measured, Helion 1.5.1) and would land
    on the first call of every compiled model, CPU ones included, that never bind a Helion kernel.
    """
    import helion.language

    if fn.__globals__.get("hl") is None:
        fn.__globals__["hl"] = helion.language
    return fn


class HelionTemplate(TemplateSpec):
    """Base of templates that are Helion kernels (see the module docstring).

    A subclass sets ``id``, ``op``, ``kernel`` (the function, decorated with
    ``@helion.kernel`` or not: tilewright rebinds it with its own settings), ``space`` and
    ``fields`` (its knobs and the Helion ``Config`` field each sets: ``(field, index)``, index
    None for a scalar field; ``PERSISTENT`` sets ``reduction_loops[0]`` to None), and
    implements :meth:`helion_call`.
    """

    backend = "helion"
    kernel: ClassVar[Callable[..., Any]]
    space = GENERIC_SPACE
    fields: ClassVar[Mapping[str, tuple[str, int | None]]] = GENERIC_FIELDS

    # -- what it serves ---------------------------------------------------------------------------
    def helion_call(self, problem: Any, target: Target) -> HelionCall | Support:
        """The kernel's arguments for ``problem`` (a :class:`HelionCall`), or why it cannot run
        it (``Support(False, reason)``)."""
        raise NotImplementedError

    def problem_support(self, problem: Any, target: Target) -> Support:
        try:
            interface_for(problem)
        except TypeError as e:
            return Support(False, str(e))
        if target.backend not in ("cuda", "hip", "cpu"):
            return Support(False, f"Helion's Triton kernels run on cuda, hip and the cpu interpreter, not {target.name}")
        if isinstance(problem, GemmProblem):
            # what the GEMM launcher (calls.GemmInterface) can hand a Helion kernel
            p = problem
            why = (f"{p.dtype} operands (Helion GEMMs take fp16, bf16, fp32)" if p.dtype not in ("fp16", "bf16", "fp32")
                   else "batched GEMMs" if p.batched else "a stored product beside the epilogue" if p.store_acc
                   else f"layouts A:{p.layout_a} B:{p.layout_b} (row or col only)"
                   if "strided" in (p.layout_a, p.layout_b) else "")
            if why:
                return Support(False, why)
        try:
            call = self.helion_call(problem, target)
        except Exception as e:  # noqa: BLE001 - a broken matcher or supports() costs this template
            return Support(False, f"{self.id} could not decide: {type(e).__name__}: {e}"[:400])
        return call if isinstance(call, Support) else SUPPORTED

    # -- identity -----------------------------------------------------------------------------
    @property
    def function(self) -> Callable[..., Any]:
        """The kernel's Python function (unwrapped from a ``helion.Kernel``)."""
        fn = getattr(self.kernel, "__func__", self.kernel)  # a plain function as a class attribute
        return getattr(fn, "fn", fn)

    @functools.cached_property
    def source_hash(self) -> str:
        """The base hash (this template's modules and the tilewright modules they import),
        the kernel's own module file and Helion's version: a new Helion, or an edit to the
        kernel, retires the template's tuning records."""
        h = hashlib.sha256(TemplateSpec.source_hash.func(self).encode())  # type: ignore[attr-defined]
        path = Path(inspect.getfile(self.function))
        h.update(path.name.encode() + path.read_bytes())
        h.update(helion_version().encode())
        return h.hexdigest()[:16]

    # -- binding and configs ----------------------------------------------------------------------
    def settings(self, problem: Any, target: Target) -> dict[str, Any]:
        """Helion settings of the rendering: static shapes unless the problem has dynamic dims
        (Helion then passes sizes and strides as arguments); the dot precision (TF32 only on
        CUDA with ``allow_tf32``: AMD compiles reject it, the interpreter computes fp32)."""
        tf32 = target.backend == "cuda" and tw_config.allow_tf32
        return {"static_shapes": not problem.dynamic, "dot_precision": "tf32" if tf32 else "ieee"}

    def bound(self, problem: Any, target: Target) -> Any:
        """The Helion kernel bound to meta tensors laid out as ``problem`` says (cached)."""
        import helion

        settings = self.settings(problem, target)
        key = (self.id, problem.stable_hash(), tuple(sorted(settings.items())))
        with _lock:
            if key in _BOUND:
                return _BOUND[key][0]
        call = self.helion_call(problem, target)
        if isinstance(call, Support):
            raise ValueError(f"{self.id}: {call.reason}")
        args = evaluate(call, interface_for(problem).names(problem))
        kernel = helion.kernel(with_helion_language(self.function), **settings)
        bound = kernel.bind(tuple(args))
        with _lock:
            # the arguments stay alive beside it: Helion proves a tensor descriptor's 16-byte
            # alignment from the bound argument itself, held weakly, at code generation
            _BOUND[key] = (bound, args)
        return bound

    def helion_config(self, params: Mapping[str, Any], bound: Any) -> Any:
        """The ``helion.Config`` for ``params`` over the bound kernel's default config.

        Raises:
            ValueError: a knob outside the kernel's config spec (a block outside its min/max,
                a block or reduction loop the kernel does not have), naming it.
        """
        import helion

        spec = bound.config_spec
        cfg = dict(spec.default_config().config)
        for knob, value in params.items():
            if knob == "PERSISTENT" or knob not in self.fields:
                continue
            field, index = self.fields[knob]
            if index is None:
                cfg[field] = value
                continue
            if field == "block_sizes" and value == 0:
                continue  # Helion's default
            seq = list(cfg.get(field) or [])
            if index >= len(seq):
                if field == "reduction_loops" and value == 0:
                    continue
                raise ValueError(f"{knob}: the kernel has {len(seq)} {field}")
            if field == "block_sizes":
                b = spec.block_sizes[index]
                if not b.min_size <= value <= b.max_size:
                    raise ValueError(f"{knob}={value} outside [{b.min_size}, {b.max_size}] of the "
                                     "kernel's config spec")
            if field == "reduction_loops" and value == 0:
                value = None
            seq[index] = value
            cfg[field] = seq
        if "PERSISTENT" in params and cfg.get("reduction_loops"):
            loops = list(cfg["reduction_loops"])
            if params["PERSISTENT"]:
                loops[0] = None
            cfg["reduction_loops"] = loops
        return helion.Config(**cfg)

    def check(self, params: Mapping[str, Any], problem: Any, target: Target) -> str | None:
        if (why := self.space_refusal(params)) is not None:
            return why
        params = self.space.complete(params)
        if params.get("indexing") == "tensor_descriptor" and not (target.has("tma") or target.has("tdm")):
            return f"tensor descriptors need TMA or TDM, which {target.name} lacks"
        if params.get("indexing") == "block_ptr" and target.backend == "hip":
            return "block pointers are not lowered for AMD targets"
        try:
            self.helion_config(params, self.bound(problem, target))
            if params.get("indexing") == "tensor_descriptor" and "make_tensor_descriptor" not in \
                    self.generated(problem, params, target):
                # Helion decides per access (2-5 dims, one of stride 1, 16-byte blocks and bases):
                # where it takes none, the setting is the pointer kernel again
                return "Helion makes no tensor descriptor for this config (blocks under 16 bytes, 1-D tensors)"
        except ValueError as e:
            return str(e)
        except Exception as e:  # noqa: BLE001 - Helion refusing to bind or generate costs this setting
            return f"Helion: {type(e).__name__}: {e}"[:400]
        return None

    def spec_or_none(self, problem: Any, target: Target) -> Any:
        """The bound kernel's config spec, or None when Helion cannot bind it (the template then
        proposes nothing for the problem, and the others are measured)."""
        try:
            return self.bound(problem, target).config_spec
        except Exception as e:  # noqa: BLE001 - any binding failure means the same here
            log.warning("%s: Helion cannot bind %s: %s: %s", self.id, problem.describe(), type(e).__name__, e)
            return None

    def seed_params(self, problem: Any, target: Target) -> list[dict[str, Any]] | None:
        """Helion's default config first (every knob at its default), then the template's
        :meth:`shape_seeds`, then each of those with tensor-descriptor indexing on targets
        with TMA or TDM."""
        seeds = [{}] + self.shape_seeds(problem, target)
        if target.has("tma") or target.has("tdm"):
            seeds += [s | {"indexing": "tensor_descriptor"} for s in seeds]
        return seeds

    def shape_seeds(self, problem: Any, target: Target) -> list[dict[str, Any]]:
        """Settings from the problem's shape (a subclass's rules); none by default."""
        return []

    # -- rendering ----------------------------------------------------------------------------
    def generated(self, problem: Any, params: Mapping[str, Any], target: Target) -> str:
        """Helion's Triton module for ``params`` (cached per process)."""
        bound = self.bound(problem, target)
        cfg = self.helion_config(params, bound)
        key = (self.id, problem.stable_hash(), repr(cfg), target.name, tw_config.allow_tf32)
        with _lock:
            if key in _GENERATED:
                return _GENERATED[key]
        text = bound.to_triton_code(cfg)
        with _lock:
            _GENERATED[key] = text
        return text

    def render_kernel(self, problem: Any, params: dict[str, Any], target: Target) -> RenderedKernel:
        from tilewright.templates.helion.interpret import for_interpreter

        call = self.helion_call(problem, target)
        assert isinstance(call, HelionCall)
        generated = self.generated(problem, params, target)
        static = self.settings(problem, target)["static_shapes"]
        host = self.function.__name__
        body = for_interpreter(generated) if target.interpreted else generated
        source = (f"# Generated by tilewright from the Helion kernel {self.function.__module__}."
                  f"{host} (template {self.id}, helion {helion_version()}) — do not edit.\n"
                  f"# {problem.describe()}\n# {dict(params)}\n" + body
                  + launcher_section(self.id, problem, host, call, static))
        name = f"{self.id.replace('.', '_')}"
        aot = None if target.interpreted else aot_spec(generated, host, call, problem, params)
        return RenderedKernel(self.id, params, target.name, source, name, interpret=target.interpreted, aot=aot)

    # -- what the compiled kernel must contain ----------------------------------------------------------
    def expected_instructions(self, problem: Any, params: Mapping[str, Any],
                              target: Target) -> list[InstructionCheck]:
        """Code for the target's ISA; with tensor-descriptor indexing, TMA
        (``cp.async.bulk.tensor``) on sm_90a/sm_100a and TDM (``tensor_load_to_lds``) on
        gfx1250. GEMM templates add their matrix instructions."""
        params = self.space.complete(params)
        if target.interpreted:
            return []
        desc = params.get("indexing") == "tensor_descriptor"
        if target.backend == "cuda":
            checks = [InstructionCheck("ptx", (rf"(?m)^\.target {target.arch}a?\b",), (), f"code for {target.arch}")]
            if desc:
                checks.append(InstructionCheck("ptx", (r"cp\.async\.bulk\.tensor",), (), "TMA through tensor descriptors"))
            return checks
        checks = [InstructionCheck("amdgcn", (rf'\.amdgcn_target "[^"]*{target.arch}"',), (), f"code for {target.arch}")]
        if desc and target.has("tdm"):
            checks.append(InstructionCheck("amdgcn", (r"tensor_load_to_lds",), (), "TDM through tensor descriptors"))
        return checks


def launcher_section(template_id: str, problem: Any, host: str, call: HelionCall, static: bool) -> str:
    """The rendered module's tail: tilewright's launcher for Helion's host function and the
    kind's ``launch``."""
    lines = ["", "", "# -- tilewright's launcher (tilewright/templates/helion/) --",
             "from tilewright.templates.helion.calls import compact, conform  # noqa: F401", *call.imports,
             f"TEMPLATE = {template_id!r}", "",
             "def _tw_launcher(kernel, grid, *args, num_warps, num_stages, **options):",
             "    if options:",
             "        raise NotImplementedError(f'{TEMPLATE}: Helion launch options {sorted(options)} are not supported')",
             "    return kernel[grid](*args, num_warps=num_warps, num_stages=num_stages)", "", ""]
    return "\n".join(lines) + interface_for(problem).launch_code(problem, host, call, static)


def aot_spec(generated: str, host: str, call: HelionCall, problem: Any, params: Mapping[str, Any]) -> AotSpec | None:
    """The kernel's :class:`AotSpec`, read off a call of Helion's host code on meta tensors:
    tensors become pointers, floats fp32 scalars, constexpr parameters (``_RDIM_SIZE_1``,
    ``_NUM_SM``, block sizes) and ints equal to 1 constants, as Triton's JIT would specialise
    them; pointers and ints divisible by 16 carry that fact. None when the host code cannot
    run on meta tensors."""
    from tilewright.runtime.loader import load_module

    module = load_module(generated, name="helion_host", interpret=False)
    seen: dict[str, Any] = {}

    def record(kernel, grid, *args, num_warps, num_stages, **options):
        seen.update(kernel=kernel, args=args, num_warps=num_warps, num_stages=num_stages)
    try:
        getattr(module, host)(*evaluate(call, interface_for(problem).names(problem)), _launcher=record)
    except Exception:  # noqa: BLE001 - host code that needs a device: no AOT for this rendering
        return None
    fn = seen["kernel"]
    pointers, constexprs, div16 = {}, {}, []
    for p, value in zip(fn.params, seen["args"]):
        if p.is_constexpr:
            constexprs[p.name] = value
        elif isinstance(value, torch.Tensor):
            pointers[p.name] = POINTER[dtypes.name_of(value.dtype)]
            div16.append(p.name)
        elif isinstance(value, bool):
            pointers[p.name] = "i1"
        elif isinstance(value, float):
            pointers[p.name] = "fp32"
        elif isinstance(value, int):
            if value == 1:
                constexprs[p.name] = 1
            else:
                pointers[p.name] = "i32" if -2**31 <= value < 2**31 else "i64"
                if value % 16 == 0:
                    div16.append(p.name)
    return AotSpec(fn.__name__, "helion", pointers, constexprs, tuple(div16),
                   {"num_warps": seen["num_warps"], "num_stages": seen["num_stages"]})
