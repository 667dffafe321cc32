"""The attention launcher's calling convention, shared by the templates of every language and
by the checks (:mod:`.checks`) that call them.

Launchers of attention kernels take, in order (:func:`input_names`):

* forward: ``launch(q, k, v, *captures, *block_mask, out=None, lse=None) -> (out, lse)``;
* backward: ``launch(q, k, v, out, dout, lse, *captures, *block_mask[, dlse], dq=None,
  dk=None, dv=None) -> (dq, dk, dv)``;

where ``block_mask`` is ``kv_num_blocks, kv_indices`` (+ ``full_kv_num_blocks,
full_kv_indices`` with full blocks), and for the backward also the transposed ``q_*`` lists.
"""

from __future__ import annotations

from tilewright.kinds.attention.problem import AttentionProblem


def block_mask_names(problem: AttentionProblem) -> list[str]:
    """The block mask's launcher inputs, by name (none without a block mask)."""
    bm = problem.block_mask
    if bm is None:
        return []
    fwd = ["kv_num_blocks", "kv_indices"] + (["full_kv_num_blocks", "full_kv_indices"] if bm.full else [])
    if problem.direction == "forward":
        return fwd
    return fwd + ["q_num_blocks", "q_indices"] + (["full_q_num_blocks", "full_q_indices"] if bm.full else [])


def input_names(problem: AttentionProblem) -> list[str]:
    """The launcher's positional inputs, by name (see the module docstring)."""
    head = ["q", "k", "v"] if problem.direction == "forward" else ["q", "k", "v", "out", "dout", "lse"]
    caps = [f"c{k}" for k in range(len(problem.captures))]
    tail = ["dlse"] if problem.lse_grad else []
    return head + caps + block_mask_names(problem) + tail
