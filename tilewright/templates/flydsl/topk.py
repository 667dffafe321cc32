"""FlyDSL top-k for gfx950 (``flydsl.topk``): the k <= 8 largest (or smallest) of each row of a
(rows, E <= 256) matrix, the MoE router's selection over expert logits.

Algorithm (ours, in ``topk.py.jinja``): one 64-lane wave per row, lane ``l`` holding columns
``l, l + 64, ...`` (at most 4). Each value becomes an int32 key that orders like the float does
under ``torch.topk`` (-0.0 equal to +0.0, NaN above +inf; the bitwise complement for
``largest=False``). Then k rounds of selection: every lane takes its best untaken slot, a
butterfly of 6 xor-shuffles (``gpu.shuffle``; on gfx950 ``ds_swizzle_b32`` and
``v_permlane{16,32}_swap``) gives the whole wave the winner (larger key, then the lower column),
and the lane that owns the winner marks it taken. No LDS, no barriers: k x 6 shuffle pairs.

Tie order: equal values come out lowest column first. ``torch.topk`` documents no order for ties
(its CPU kernel does not give lowest-first), so on ties the indices may differ from ATen's while
values and the set of selected values agree; :func:`selection_in_torch` is this kernel's
algorithm written in torch (lanes as a tensor dim), the proof the tests run on this host.

The module's ``launch(x, out=None)`` runs it on the current stream of x's device; here it is
built for gfx950 through that ``launch`` in a child process (compile-only) and its ISA checked;
it has not run on hardware.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from tilewright.runtime.aot import AotSpec
from tilewright.templates.flydsl.runtime import LDS_LIMIT as FLY_LDS_LIMIT
from tilewright.runtime.targets import Target
from tilewright.runtime.verify import InstructionCheck
from tilewright.templates.base import Knob, ParamSpace, Params, RenderedKernel, Support, SUPPORTED, TemplateSpec
from tilewright.templates.flydsl.gemm import LaunchedWhereInstalled

WAVE = 64          # gfx950 wavefront
MAX_E = 4 * WAVE   # columns per row: 4 per lane keeps every key in registers
MAX_K = 8          # selection rounds are unrolled; the MoE router's top-k is 1..8
DTYPES = {"fp32": ("Float32", "float32"), "bf16": ("BFloat16", "bfloat16"), "fp16": ("Float16", "float16")}
ARCH = "gfx950"
LDS_LIMIT = FLY_LDS_LIMIT[ARCH]  # 160 KiB per workgroup on gfx950 (CDNA4)
VGPR_LIMIT = 256                 # architected VGPRs per lane (AGPRs are the other 256)


@dataclass(frozen=True)
class TopkProblem:
    """One top-k shape class: rows are a run-time size (any count), ``E`` the row length.

    Attributes:
        E: elements per row (1..256), the selected dim (the last, contiguous).
        k: how many to select (1..8, at most E).
        dtype: "fp32", "bf16" or "fp16"; values come back in it, indices as int64.
        largest: select the largest (True) or the smallest.
    """

    E: int
    k: int
    dtype: str
    largest: bool = True
    op: str = "topk"

    def to_json(self) -> dict[str, Any]:
        return {"kind": "topk", **dataclasses.asdict(self)}

    def describe(self) -> str:
        return f"top-{self.k} of rows of {self.E} {self.dtype} ({'largest' if self.largest else 'smallest'})"


class FlyDslTopk(LaunchedWhereInstalled, TemplateSpec):

    id = "flydsl.topk"
    backend = "flydsl"
    op = "topk"
    jinja = "topk.py.jinja"
    space = ParamSpace((
        Knob("ROWS", (1, 2, 4), 1, "rows (waves) per workgroup; more amortise the launch per CU"),
    ))

    def problem_support(self, problem: Any, target: Target) -> Support:
        if not isinstance(problem, TopkProblem):
            return Support(False, "flydsl.topk serves TopkProblem only")
        if target.arch != ARCH:
            return Support(False, f"FlyDSL top-k is written for {ARCH} (wave64), not {target.arch}")
        if problem.dtype not in DTYPES:
            return Support(False, f"dtype {problem.dtype} (takes {', '.join(DTYPES)})")
        if not 1 <= problem.E <= MAX_E:
            return Support(False, f"rows of {problem.E} elements (1..{MAX_E}: 4 per lane of one wave)")
        if not 1 <= problem.k <= min(MAX_K, problem.E):
            return Support(False, f"k={problem.k} (1..{min(MAX_K, problem.E)}: rounds are unrolled)")
        return SUPPORTED

    def seed_params(self, problem: TopkProblem, target: Target) -> list[dict]:
        return [{"ROWS": r} for r in (4, 1, 2)]

    def check(self, params: Params, problem: TopkProblem, target: Target) -> str | None:
        why = self.space_refusal(params)
        if why:
            return why
        threads = self.space.complete(params)["ROWS"] * WAVE
        if threads > target.max_threads_per_block:
            return f"{threads} threads per workgroup exceed {target.max_threads_per_block}"
        return None

    def render_kernel(self, problem: TopkProblem, params: Params, target: Target) -> RenderedKernel:
        p = params
        items = -(-problem.E // WAVE)
        fx_dtype, torch_dtype = DTYPES[problem.dtype]
        source = self.render_jinja(
            WAVE=WAVE, WAVE_LOG2=WAVE.bit_length() - 1, ITEMS=items, K=problem.k, E=problem.E,
            ROWS=p["ROWS"], LARGEST=problem.largest, DTYPE=fx_dtype, TORCH_DTYPE=torch_dtype)
        name = f"topk_e{items * WAVE}_k{problem.k}_{problem.dtype}_{'max' if problem.largest else 'min'}_r{p['ROWS']}"
        return RenderedKernel(
            template_id=self.id, params=p, target=target.name, source=source, name=name,
            entry="launch", language="flydsl", meta={"items_per_lane": items, "threads": p["ROWS"] * WAVE},
            aot=AotSpec(kernel="launch", language="flydsl", pointer_types={}, constexprs={},
                        divisible_by_16=(), options={"gpu_arch": ARCH}))

    def expected_instructions(self, problem: TopkProblem, params: Params, target: Target) -> list[InstructionCheck]:
        # the butterfly's shuffles: offsets < 32 lower to ds_swizzle, 32 to the gfx950 permlane swap
        return [InstructionCheck(
            "amdgcn", require=(r"ds_swizzle_b32", r"v_permlane32_swap_b32"),
            forbid=(r"\bscratch_(load|store)", r"\bds_(read|write)_b"),
            why="top-k selection in registers across one wave (shuffles, no LDS, no spills)")]


def resource_failures(lds_bytes: int, vgprs: int, agprs: int, scratch_bytes: int) -> list[str]:
    """Why a compiled top-k kernel breaks its budget (empty when it does not): LDS over gfx950's
    160 KiB, any scratch (spills), more than 256 VGPRs or 512 VGPRs + AGPRs per lane."""
    out = []
    if lds_bytes > LDS_LIMIT:
        out.append(f"LDS {lds_bytes} B exceeds {LDS_LIMIT} B")
    if scratch_bytes:
        out.append(f"{scratch_bytes} B of scratch per lane (registers spilled)")
    if vgprs > VGPR_LIMIT or vgprs + agprs > 2 * VGPR_LIMIT:
        out.append(f"{vgprs} VGPRs + {agprs} AGPRs exceed {VGPR_LIMIT} (+ {VGPR_LIMIT} AGPRs) per lane")
    return out


def order_keys(x: torch.Tensor, largest: bool = True) -> torch.Tensor:
    """The kernel's int32 keys of ``x`` (any float dtype), as int64: ordered like ``torch.topk``
    orders values (-0.0 == +0.0, all NaNs largest), complemented for ``largest=False``."""
    bits = x.float().view(torch.int32).to(torch.int64)
    bits = torch.where(x == 0, torch.zeros_like(bits), bits)
    key = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    key = torch.where(torch.isnan(x), torch.full_like(key, 2**31 - 1), key)
    return key if largest else ~key


def selection_in_torch(x: torch.Tensor, k: int, largest: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's algorithm on a (rows, E) tensor, lanes as a dim of 64: per-lane best of its
    strided columns, a 6-step xor butterfly, the winner marked taken; k rounds.

    Returns (values (rows, k) of x's dtype, indices (rows, k) int64), lowest column first on ties.
    """
    rows, E = x.shape
    items = -(-E // WAVE)
    pad = items * WAVE - E
    keys = torch.nn.functional.pad(order_keys(x, largest), (0, pad), value=-2**31)
    cols = torch.nn.functional.pad(torch.arange(E).expand(rows, E), (0, pad), value=1 << 20)
    keys = keys.view(rows, items, WAVE).clone()  # [row, item i, lane l] is column l + i * WAVE
    cols = cols.reshape(rows, items, WAVE).clone()
    lane = torch.arange(WAVE)

    def beats(ka, ca, kb, cb):
        return (ka > kb) | ((ka == kb) & (ca < cb))

    out = torch.empty(rows, k, dtype=torch.int64)
    for j in range(k):
        bk, bc = keys[:, 0], cols[:, 0]
        for i in range(1, items):
            win = beats(keys[:, i], cols[:, i], bk, bc)
            bk, bc = torch.where(win, keys[:, i], bk), torch.where(win, cols[:, i], bc)
        for s in range(WAVE.bit_length() - 1):
            partner = lane ^ (WAVE >> (s + 1))
            ok, oc = bk[:, partner], bc[:, partner]
            win = beats(ok, oc, bk, bc)
            bk, bc = torch.where(win, ok, bk), torch.where(win, oc, bc)
        assert bool((bc == bc[:, :1]).all()), "the butterfly must leave every lane with one winner"
        out[:, j] = bc[:, 0]
        hit = cols == bc[:, None, :1]
        keys = torch.where(hit, torch.full_like(keys, -2**31), keys)
        cols = torch.where(hit, torch.full_like(cols, 1 << 20), cols)
    return x.gather(1, out), out


TEMPLATE = FlyDslTopk()
