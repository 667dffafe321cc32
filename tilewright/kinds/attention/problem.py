"""Attention as a problem kind, "attention": ``out = softmax(mod(scale * Q Kᵀ) masked) V``.

One :class:`AttentionProblem` covers what ``F.scaled_dot_product_attention`` and
``flex_attention`` compute, forward and backward:

* shapes: batch ``B``, query heads ``H`` and key/value heads ``H_kv`` (GQA when ``H_kv < H``,
  MQA when it is 1; query head ``h`` reads KV head ``h // (H // H_kv)``), query length ``Sq``,
  key length ``Skv``, head dims ``D`` (Q and K) and ``Dv`` (V and the output);
* the scores ``s = scale * q·k`` are modified by ``score_mod`` and masked by ``mask_mod``, both
  expression IR (:mod:`tilewright.ir.expr`) over the score (the IR's ``acc``, fp32) and the
  indices ``b, h, m, n`` (batch, query head, query position, key position;
  :mod:`tilewright.kinds.attention.mods`), reading captured tensors ``c0, c1, ...`` by (possibly
  indirect) loads; ``causal`` is SDPA's ``is_causal`` (top-left: ``m >= n``), kept apart so
  kernels can skip the key blocks past the diagonal;
* a FlexAttention block mask (:class:`BlockMaskSpec`): per query block of ``q_block`` rows,
  the key blocks of ``kv_block`` columns that are *partial* (the mask_mod is evaluated there)
  and *full* (taken without evaluating it); key blocks in neither list are skipped, as
  FlexAttention does. The block mask is run-time data read on the device;
* outputs: ``out`` (B, H, Sq, Dv) and the log-sum-exp of each row's modified, masked scores,
  ``lse`` (B, H, Sq), fp32, in base e or base 2 (``lse_base``: FlexAttention's operator
  returns base 2, SDPA's ops base e). A row with no unmasked key gets ``out = 0`` and
  ``lse = empty_lse`` (-inf, FlexAttention's value; 0.0 for SDPA's CPU kernel);
* ``direction="backward"``: dQ, dK, dV from Q, K, V, out, dout and lse (and, with
  ``lse_grad``, a gradient of the lse); with ``score_grad`` also ``ds``, the gradient of the
  modified, masked scores (B, H, Sq, Skv), fp32, 0 where a score is masked: an additive mask's
  gradient before its broadcast is summed (SDPA with a mask that requires grad).

Sizes that vary at run time (``dynamic``: "B", "Sq", "Skv") are tuned at buckets; kernels mask
every edge, so no length needs to be a multiple of a block.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from tilewright.problem import ELEMENT_BYTES, json_digest

DIRECTIONS = ("forward", "backward")
ATTENTION_DTYPES = ("fp32", "fp16", "bf16")
LSE_BASES = ("e", "2")
DIMS = ("B", "Sq", "Skv")  # the sizes that may be dynamic
# output names per direction, in the order launchers return them
OUTPUTS = {"forward": ("out", "lse"), "backward": ("dq", "dk", "dv")}


@dataclass(frozen=True)
class Capture:
    """A tensor a modification reads (``c{k}`` in the IR): its shape, dtype and, for integer
    tensors used as indices, the half-open range of values the indexing allows (random tuning
    inputs stay inside it)."""

    shape: tuple[int, ...]
    dtype: str
    bounds: tuple[int, int] | None = None
    # per dim, the problem size it follows ("B", "H", "Sq", "Skv") when that size is dynamic
    # (an SDPA mask of (B, 1, Sq, Skv) in a decode loop), None for a fixed extent; () when
    # every extent is fixed. A problem moved to a bucket resizes such dims with it.
    dims: tuple[str | None, ...] = ()

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype,
                **({"bounds": list(self.bounds)} if self.bounds else {}),
                **({"dims": list(self.dims)} if any(self.dims) else {})}

    @staticmethod
    def from_json(d: dict) -> "Capture":
        b = d.get("bounds")
        return Capture(tuple(d["shape"]), d["dtype"], tuple(b) if b else None, tuple(d.get("dims", ())))

    def resized(self, sizes: dict[str, int]) -> "Capture":
        """This capture with the dims that follow a problem size set to ``sizes[dim]``."""
        if not any(self.dims):
            return self
        shape = tuple(sizes[d] if d is not None and d in sizes else s for s, d in zip(self.shape, self.dims))
        return dataclasses.replace(self, shape=shape)


@dataclass(frozen=True)
class BlockMaskSpec:
    """The static facts of a FlexAttention block mask (its tensors are run-time inputs).

    Attributes:
        q_block, kv_block: rows and columns of one sparse block (``BLOCK_SIZE``).
        batch, heads: the block mask's own batch and head extents (1: shared by all).
        full: whether the full-block lists exist (``full_kv_num_blocks``/``full_kv_indices``).
    """

    q_block: int
    kv_block: int
    batch: int = 1
    heads: int = 1
    full: bool = True

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class AttentionProblem:
    """One attention kernel's problem (see the module docstring).

    Attributes:
        B, H, H_kv, Sq, Skv, D, Dv: sizes (at their bucket when dynamic).
        dtype: of Q, K, V and the outputs ("fp32", "fp16", "bf16"); lse is fp32.
        scale: multiplies q·k before the score_mod (SDPA's and flex's ``scale``).
        causal: top-left causal masking (``m >= n``) on top of ``mask_mod``.
        score_mod, mask_mod: canonical JSON of the IR (:func:`tilewright.kinds.attention.mods.dumps`),
            "" for none.
        captures: the tensors the modifications read, ``c0, c1, ...`` in order.
        block_mask: the block mask's static facts, or None (every key block is partial when
            there is a mask_mod or ``causal``, full otherwise).
        lse_base: "e" or "2".
        empty_lse: the lse of a row with no unmasked key.
        lse_grad: backward only: a gradient of lse is an input too.
        score_grad: backward only: ``ds`` (the modified scores' gradient) is an output too.
        renorm: backward only: P as a materialised softmax gives it (SDPA's math form), not as
            fused kernels recompute it from the lse: a row whose lse swallowed log(count) (every
            kept score an additive mask's finfo.min, equal in fp32) gets 1 / count, not 1.
        orders: physical dim order of outputs as laid out in the traced graph, e.g.
            ``(("out", (0, 2, 1, 3)),)`` for an output stored (B, Sq, H, Dv); absent means
            contiguous.
        dynamic: dims ("B", "Sq", "Skv") that vary at run time.
        op: what it came from, for display ("sdpa", "flex_attention", "eager_attention").
    """

    B: int
    H: int
    H_kv: int
    Sq: int
    Skv: int
    D: int
    Dv: int
    dtype: str
    scale: float
    direction: str = "forward"
    causal: bool = False
    score_mod: str = ""
    mask_mod: str = ""
    captures: tuple[Capture, ...] = ()
    block_mask: BlockMaskSpec | None = None
    lse_base: str = "e"
    empty_lse: float = -math.inf
    lse_grad: bool = False
    score_grad: bool = False
    renorm: bool = False
    orders: tuple[tuple[str, tuple[int, ...]], ...] = ()
    dynamic: frozenset[str] = field(default_factory=frozenset)
    op: str = "attention"

    kind = "attention"  # class attribute: the problem kind (not a field)

    def __post_init__(self) -> None:
        for name in ("B", "H", "H_kv", "Sq", "Skv", "D", "Dv"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"AttentionProblem.{name} must be a non-negative int, got {v!r}")
        if self.H_kv < 1 or self.H % self.H_kv:
            raise ValueError(f"query heads H={self.H} must be a multiple of KV heads H_kv={self.H_kv}")
        if self.dtype not in ATTENTION_DTYPES:
            raise ValueError(f"attention dtype {self.dtype!r}; known: {ATTENTION_DTYPES}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction {self.direction!r}; known: {DIRECTIONS}")
        if self.lse_base not in LSE_BASES:
            raise ValueError(f"lse_base {self.lse_base!r}; known: {LSE_BASES}")
        if not math.isfinite(self.scale):
            raise ValueError(f"scale must be finite, got {self.scale}")
        if self.lse_grad and self.direction != "backward":
            raise ValueError("lse_grad is an input of the backward only")
        if (self.score_grad or self.renorm) and self.direction != "backward":
            raise ValueError("score_grad and renorm are the backward's only")
        if set(self.dynamic) - set(DIMS):
            raise ValueError(f"dynamic dims {sorted(self.dynamic)}; only {DIMS} may vary")
        bm = self.block_mask
        if bm is not None and (bm.batch not in (1, self.B) or bm.heads not in (1, self.H)):
            raise ValueError(f"block mask over batch {bm.batch}, heads {bm.heads} does not broadcast "
                             f"to B={self.B}, H={self.H}")

    # -- shapes ---------------------------------------------------------------------------------
    @property
    def group(self) -> int:
        """Query heads per KV head (1 without GQA)."""
        return self.H // self.H_kv

    @property
    def output_names(self) -> tuple[str, ...]:
        return OUTPUTS[self.direction] + (("ds",) if self.score_grad else ())

    def order(self, name: str) -> tuple[int, ...]:
        """The physical dim order of output ``name`` (contiguous when not recorded)."""
        for n, o in self.orders:
            if n == name:
                return o
        return tuple(range(3 if name == "lse" else 4))

    def shape(self, name: str) -> tuple[int, ...]:
        """The logical shape of a tensor of the problem by name (q, k, v, out, dout, lse,
        dlse, dq, dk, dv)."""
        q = (self.B, self.H, self.Sq, self.D)
        kv = (self.B, self.H_kv, self.Skv, self.D)
        return {"q": q, "dq": q, "k": kv, "dk": kv,
                "v": (self.B, self.H_kv, self.Skv, self.Dv), "dv": (self.B, self.H_kv, self.Skv, self.Dv),
                "out": (self.B, self.H, self.Sq, self.Dv), "dout": (self.B, self.H, self.Sq, self.Dv),
                "lse": (self.B, self.H, self.Sq), "dlse": (self.B, self.H, self.Sq),
                "ds": (self.B, self.H, self.Sq, self.Skv)}[name]

    @property
    def has_mask(self) -> bool:
        """Whether any score is masked by a rule (a mask_mod or causal)."""
        return bool(self.mask_mod) or self.causal

    # -- derived quantities ---------------------------------------------------------------------
    @property
    def density(self) -> float:
        """The fraction of the Sq x Skv scores computed: 1/2 (about) under causal masking,
        1 otherwise (a block mask's sparsity is data, unknown here)."""
        if self.causal and self.Sq and self.Skv:
            return min(1.0, (self.Sq + 1) / (2 * self.Skv)) if self.Sq <= self.Skv else \
                1.0 - (self.Skv - 1) / (2 * self.Sq)
        return 1.0

    @property
    def flops(self) -> int:
        """2 FLOPs per multiply-add of Q Kᵀ and P V (forward); the backward does 2.5x that
        (Q Kᵀ again, dP, dV, dQ, dK)."""
        fwd = 2 * self.B * self.H * self.Sq * self.Skv * (self.D + self.Dv) * self.density
        return int(fwd * (2.5 if self.direction == "backward" else 1))

    @property
    def min_bytes(self) -> int:
        """Q, K, V and the outputs crossing memory once (the backward reads out and dout and
        writes dq, dk, dv), lse in fp32."""
        e = ELEMENT_BYTES[self.dtype]
        n = lambda name: math.prod(self.shape(name))  # noqa: E731
        total = (n("q") + n("k") + n("v")) * e + 4 * n("lse")
        if self.direction == "forward":
            total += n("out") * e
        else:
            total += (n("out") + n("dout") + n("dq") + n("dk") + n("dv")) * e
            total += 4 * n("ds") if self.score_grad else 0
        for c in self.captures:
            total += math.prod(c.shape) * ELEMENT_BYTES.get(c.dtype, 8)
        return int(total)

    def with_sizes(self, **sizes: int) -> "AttentionProblem":
        """The problem at other sizes (a bucket); captured tensors whose dims follow a size
        (:attr:`Capture.dims`) are resized with it."""
        changed = dataclasses.replace(self, **sizes)
        if not any(any(c.dims) for c in self.captures):
            return changed
        now = {d: getattr(changed, d) for d in ("B", "H", "Sq", "Skv")}
        return dataclasses.replace(changed, captures=tuple(c.resized(now) for c in self.captures))

    # -- identity -------------------------------------------------------------------------------
    def to_json(self) -> dict:
        d: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["captures"] = [c.to_json() for c in self.captures]
        d["block_mask"] = self.block_mask.to_json() if self.block_mask else None
        d["empty_lse"] = repr(self.empty_lse) if not math.isfinite(self.empty_lse) else self.empty_lse
        d["orders"] = [[n, list(o)] for n, o in self.orders]
        d["dynamic"] = sorted(self.dynamic)
        d["kind"] = self.kind
        for name in ("score_grad", "renorm"):  # absent when off: the hashes of problems before them stay
            if not d[name]:
                del d[name]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "AttentionProblem":
        d = dict(d)
        d.pop("kind", None)
        d["captures"] = tuple(Capture.from_json(c) for c in d.get("captures", ()))
        d["block_mask"] = BlockMaskSpec(**d["block_mask"]) if d.get("block_mask") else None
        d["empty_lse"] = float(d.get("empty_lse", "-inf"))
        d["orders"] = tuple((n, tuple(o)) for n, o in d.get("orders", ()))
        d["dynamic"] = frozenset(d.get("dynamic", ()))
        return cls(**d)

    def stable_hash(self) -> str:
        return json_digest(self.to_json())

    def describe_mods(self) -> str:
        parts = []
        if self.causal:
            parts.append("causal")
        if self.score_mod:
            parts.append("score_mod")
        if self.mask_mod:
            parts.append("mask_mod")
        if self.score_grad:
            parts.append("score grad")
        if self.block_mask:
            bm = self.block_mask
            parts.append(f"block mask {bm.q_block}x{bm.kv_block}{'' if bm.full else ' (no full blocks)'}")
        if self.captures:
            parts.append(f"{len(self.captures)} captured")
        return ", ".join(parts) or "-"

    def describe(self) -> str:
        heads = f"H={self.H}" + (f"/{self.H_kv}kv" if self.H_kv != self.H else "")
        dims = f"D={self.D}" + (f"/{self.Dv}" if self.Dv != self.D else "")
        dyn = f" dynamic {','.join(sorted(self.dynamic))}" if self.dynamic else ""
        return (f"{self.op} {self.direction} B={self.B} {heads} Sq={self.Sq} Skv={self.Skv} {dims} "
                f"{self.dtype} scale={self.scale:.4g}{dyn} mods: {self.describe_mods()}")
