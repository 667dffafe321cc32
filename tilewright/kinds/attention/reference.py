"""Attention written out in torch: the float64 reference every attention kernel is checked
against, and (in fp32) the ATen fallback of a problem no generated kernel serves.

The scores are materialised one batch entry and a few heads at a time (``CHUNK_SCORES``
elements), so the reference of a long sequence costs a slab, not the whole (B, H, Sq, Skv).

Semantics (FlexAttention's, which SDPA's are a case of): a score ``s = scale * q·k`` becomes
``score_mod(s, b, h, m, n)``; it is kept where the key is allowed: inside a *full* block of
the block mask, or inside a *partial* block where ``mask_mod`` (and ``causal``: ``m >= n``)
holds; without a block mask, wherever ``mask_mod``/``causal`` hold. Kept scores equal to -inf
(an additive mask's) count as masked too. ``lse`` is the log-sum-exp of the kept scores of a
row, ``out = softmax · V``; a row with nothing kept has ``out = 0`` and ``lse = empty_lse``.

The backward follows FlashAttention-2 (Dao, 2023, algorithm 2): ``P = exp(s' - lse)`` from the
*given* lse, ``dV = Pᵀ dO``, ``dP = dO Vᵀ``, ``δ = rowsum(dO ∘ O) - dlse``, ``dS = P ∘ (dP - δ)``,
then through the score_mod's derivative (:func:`tilewright.kinds.attention.mods.score_derivative`),
``dQ = scale · dS K``, ``dK = scale · dSᵀ Q``; GQA sums dK and dV over each KV head's group.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import torch

from tilewright.kinds.attention import mods
from tilewright.kinds.attention.problem import AttentionProblem

CHUNK_SCORES = 1 << 24  # score elements materialised at a time
# an lse beyond this has swallowed log(sum): a row whose every kept score is an additive mask's
# finfo.min has scores equal in fp32 and lse = max + log(count) rounded to the max, so
# exp(s - lse) is 1 where the softmax is 1 / count. Fused kernels (SDPA's CPU flash backward)
# take the 1; a ``renorm`` problem (SDPA's math form, which saves the softmax) rescales such a
# row's P by 1 / rowsum. ulp(1e12) in fp32 is 2^16, past any log(count)
SATURATED_LSE = 1e12
LN2 = math.log(2.0)


def _heads_per_chunk(problem: AttentionProblem) -> int:
    per_head = max(1, problem.Sq * problem.Skv)
    return max(1, min(problem.H, CHUNK_SCORES // per_head))


def at_call_sizes(problem: AttentionProblem, q: torch.Tensor, k: torch.Tensor) -> AttentionProblem:
    """``problem`` at the sizes of the call's own tensors (q (B, H, Sq, D), k (B, Hkv, Skv, D)):
    a dynamic problem is compiled at its size bucket, and the ATen form of a bucket's kernel
    runs every size in it (a batch of 3 in the bucket of 4 computes 3 rows, not 4)."""
    B, Sq, Skv = int(q.shape[0]), int(q.shape[2]), int(k.shape[2])
    if (B, Sq, Skv) == (problem.B, problem.Sq, problem.Skv):
        return problem
    return dataclasses.replace(problem, B=B, Sq=Sq, Skv=Skv)


def _env(problem: AttentionProblem, b: int, h0: int, h1: int, captures: Sequence[torch.Tensor],
         device: torch.device) -> dict:
    env = {"b": torch.full((1, 1, 1, 1), b, dtype=torch.int64, device=device),
           "h": torch.arange(h0, h1, device=device).view(1, -1, 1, 1),
           "m": torch.arange(problem.Sq, device=device).view(1, 1, -1, 1),
           "n": torch.arange(problem.Skv, device=device).view(1, 1, 1, -1)}
    env.update({f"c{k}": t for k, t in enumerate(captures)})
    return env


def _expand_blocks(num: torch.Tensor, idx: torch.Tensor, n_kv_blocks: int) -> torch.Tensor:
    """(..., nQ) counts and (..., nQ, L) indices → (..., nQ, n_kv_blocks) booleans of the listed
    blocks."""
    L = idx.shape[-1]
    listed = torch.arange(L, device=idx.device) < num[..., None].to(torch.int64)
    dense = torch.zeros(*idx.shape[:-1], n_kv_blocks + 1, dtype=torch.bool, device=idx.device)
    target = torch.where(listed, idx.to(torch.int64).clamp(0, n_kv_blocks), n_kv_blocks)
    dense.scatter_(-1, target, True)
    return dense[..., :n_kv_blocks]


def allowed(problem: AttentionProblem, env: dict, block_mask: Sequence[torch.Tensor]) -> torch.Tensor:
    """Which (b, h, m, n) of the chunk in ``env`` are kept (broadcastable boolean tensor)."""
    keep = None
    mask = mods.loads(problem.mask_mod)
    if mask is not None:
        keep = mods.evaluate(mask, env, reference=True).to(torch.bool)
    if problem.causal:
        c = env["m"] >= env["n"]
        keep = c if keep is None else keep & c
    bm = problem.block_mask
    if bm is None:
        return keep if keep is not None else torch.ones((), dtype=torch.bool, device=env["m"].device)
    n_kv = -(-problem.Skv // bm.kv_block)
    b = int(env["b"].flatten()[0]) if bm.batch > 1 else 0
    heads = env["h"].flatten()
    hs = heads if bm.heads > 1 else torch.zeros_like(heads)
    qb = torch.arange(problem.Sq, device=env["m"].device) // bm.q_block
    kb = torch.arange(problem.Skv, device=env["m"].device) // bm.kv_block

    def dense(num: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        blocks = _expand_blocks(num[b][hs], idx[b][hs], n_kv)  # (Hc, nQ, nKV)
        return blocks[:, qb][:, :, kb][None]  # (1, Hc, Sq, Skv)

    partial = dense(block_mask[0], block_mask[1])
    if keep is not None:
        partial = partial & keep
    if bm.full:
        partial = partial | dense(block_mask[2], block_mask[3])
    return partial


def scores(problem: AttentionProblem, q: torch.Tensor, k: torch.Tensor, env: dict,
           block_mask: Sequence[torch.Tensor], reference: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(raw scores ``scale * q kᵀ``, modified and masked scores: -inf where not kept)."""
    raw = torch.matmul(q, k.transpose(-1, -2)) * problem.scale
    sm = mods.loads(problem.score_mod)
    s = mods.evaluate(sm, env | {"score": raw}, reference=reference).to(raw.dtype) if sm is not None else raw
    s = torch.broadcast_to(s, raw.shape)
    keep = allowed(problem, env, block_mask)
    return raw, s.masked_fill(~keep, -math.inf)


def forward(problem: AttentionProblem, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            captures: Sequence[torch.Tensor] = (), block_mask: Sequence[torch.Tensor] = (), *,
            reference: bool = True, out: torch.Tensor | None = None, lse: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of a forward problem: out in float64 (``reference``) or the problem's dtype
    (computed in fp32), lse in float64 or fp32, in the problem's base. Written into ``out`` and
    ``lse`` when given."""
    problem = at_call_sizes(problem, q, k)
    dt = torch.float64 if reference else torch.float32
    device = q.device
    G = problem.group
    o = torch.zeros(problem.shape("out"), dtype=dt, device=device)
    l_all = torch.zeros(problem.shape("lse"), dtype=dt, device=device)
    step = _heads_per_chunk(problem)
    for b in range(problem.B):
        for h0 in range(0, problem.H, step):
            h1 = min(problem.H, h0 + step)
            kv_heads = torch.arange(h0, h1, device=device) // G
            qq = q[b, h0:h1].to(dt)
            kk = k[b, kv_heads].to(dt)
            vv = v[b, kv_heads].to(dt)
            env = _env(problem, b, h0, h1, captures, device)
            _, s = scores(problem, qq[None], kk[None], env, block_mask, reference)
            s = s[0]
            empty = ~(s > -math.inf).any(-1)
            row = torch.logsumexp(s, -1)
            safe = torch.where(empty, torch.zeros_like(row), row)
            p = torch.exp(s - safe[..., None])
            o[b, h0:h1] = p @ vv
            base = row if problem.lse_base == "e" else row / LN2
            l_all[b, h0:h1] = torch.where(empty, torch.full_like(row, problem.empty_lse), base)
    if out is not None:
        out.copy_(o)
    else:
        out = o if reference else o.to(q.dtype)
    if lse is not None:
        lse.copy_(l_all)
    else:
        lse = l_all if reference else l_all.float()
    return out, lse


def backward(problem: AttentionProblem, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             out: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor,
             captures: Sequence[torch.Tensor] = (), block_mask: Sequence[torch.Tensor] = (),
             dlse: torch.Tensor | None = None, *, reference: bool = True
             ) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv) of a backward problem (see the module docstring), float64 with
    ``reference``, else in the problem's dtype (computed in fp32); with ``score_grad`` also
    ``ds`` (B, H, Sq, Skv), the modified scores' gradient (float64, or fp32), 0 where masked.

    Raises:
        NotDifferentiable: the score_mod has an op :func:`mods.score_derivative` cannot
            differentiate.
    """
    problem = at_call_sizes(problem, q, k)
    dt = torch.float64 if reference else torch.float32
    device = q.device
    G = problem.group
    dmod = mods.score_derivative(mods.loads(problem.score_mod))
    dq = torch.zeros(problem.shape("q"), dtype=dt, device=device)
    dk = torch.zeros(problem.shape("k"), dtype=dt, device=device)
    dv = torch.zeros(problem.shape("v"), dtype=dt, device=device)
    ds_all = torch.zeros(problem.shape("ds"), dtype=dt, device=device) if problem.score_grad else None
    step = _heads_per_chunk(problem)
    for b in range(problem.B):
        for h0 in range(0, problem.H, step):
            h1 = min(problem.H, h0 + step)
            kv_heads = torch.arange(h0, h1, device=device) // G
            qq, kk, vv = q[b, h0:h1].to(dt), k[b, kv_heads].to(dt), v[b, kv_heads].to(dt)
            oo, do = out[b, h0:h1].to(dt), dout[b, h0:h1].to(dt)
            ll = lse[b, h0:h1].to(dt)
            if problem.lse_base == "2":
                ll = ll * LN2
            env = _env(problem, b, h0, h1, captures, device)
            raw, s = scores(problem, qq[None], kk[None], env, block_mask, reference)
            raw, s = raw[0], s[0]
            kept = s > -math.inf
            p = torch.where(kept, torch.exp(s - torch.where(torch.isfinite(ll), ll, 0)[..., None]), 0)
            sat = (ll.abs() > SATURATED_LSE) & torch.isfinite(ll)
            if problem.renorm and bool(sat.any()):
                total = p.sum(-1, keepdim=True)
                p = torch.where(sat[..., None] & (total > 0), p / total.clamp_min(1e-300), p)
            dp = do @ vv.transpose(-1, -2)
            delta = (do * oo).sum(-1)
            if dlse is not None:
                g = dlse[b, h0:h1].to(dt)
                delta = delta - (g / LN2 if problem.lse_base == "2" else g)
            ds = p * (dp - delta[..., None])
            if ds_all is not None:
                ds_all[b, h0:h1] = ds
            if dmod is not None:
                # a derivative that is a constant (a padding mask's score + where(keep, 0, -inf)
                # has d/dscore 1) comes back 0-dim: broadcast before taking the batch's slice
                grad = mods.evaluate(dmod, env | {"score": raw[None]}, reference=reference)
                grad = torch.broadcast_to(grad, raw[None].shape)[0].to(dt)
                ds = torch.where(kept, ds * grad, 0)
            dq[b, h0:h1] = problem.scale * ds @ kk
            dk[b].index_add_(0, kv_heads, problem.scale * ds.transpose(-1, -2) @ qq)
            dv[b].index_add_(0, kv_heads, p.transpose(-1, -2) @ do)
    extra = (ds_all,) if ds_all is not None else ()
    if reference:
        return (dq, dk, dv, *extra)
    return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), *(t.float() for t in extra))


# -- block masks -------------------------------------------------------------------------------
def block_mask_tensors(keep: torch.Tensor, q_block: int, kv_block: int, *, full: bool = True
                       ) -> list[torch.Tensor]:
    """A FlexAttention block mask from a dense boolean ``keep`` (Bm, Hm, Sq, Skv), as
    ``create_block_mask`` builds it: for each query block the key blocks with some kept
    element are *partial*, those with every element kept *full* (with ``full``; else partial),
    listed in ascending order; int32 ``[kv_num_blocks, kv_indices, full_kv_num_blocks,
    full_kv_indices, q_num_blocks, q_indices, full_q_num_blocks, full_q_indices]`` (the q_*
    lists are the transpose, for the backward); the full ones omitted without ``full``."""
    Bm, Hm, Sq, Skv = keep.shape
    nq, nk = -(-Sq // q_block), -(-Skv // kv_block)
    padded = torch.zeros(Bm, Hm, nq * q_block, nk * kv_block, dtype=torch.bool, device=keep.device)
    padded[..., :Sq, :Skv] = keep
    valid = torch.zeros_like(padded)
    valid[..., :Sq, :Skv] = True
    blocks = padded.view(Bm, Hm, nq, q_block, nk, kv_block)
    vblocks = valid.view(Bm, Hm, nq, q_block, nk, kv_block)
    some = blocks.any(-1).any(-2)
    every = (blocks | ~vblocks).all(-1).all(-2) & some
    partial = some & ~every if full else some

    def lists(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        num = dense.sum(-1).to(torch.int32)
        order = torch.argsort((~dense).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return num, order

    out = [*lists(partial)]
    if full:
        out += [*lists(every)]
    out += [*lists(partial.transpose(-1, -2))]
    if full:
        out += [*lists(every.transpose(-1, -2))]
    return [t.contiguous() for t in out]
