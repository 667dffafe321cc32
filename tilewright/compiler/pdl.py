"""Programmatic dependent launch between the kernels of a compiled graph, decided per edge.

An *edge* is a generated kernel (GEMM or loop kernel) and the generated kernel the wrapper
launches right after it on the same stream (ATen ops that launch nothing, views and tuple
accesses, do not break it; any other ATen call does: its kernel neither waits nor releases).
An edge is on when both ends can take PDL (a template with the ``PDL`` knob that accepts
``PDL=True`` for the problem on the target: Triton on sm_90+ with a Triton that has
``gdc_wait`` and ``launch_pdl``, CuTeDSL on its arch) and ``config.pdl`` says so:

* ``off``: never (no kernel is rendered with griddepcontrol);
* ``on``: every capable edge;
* ``auto``: the pair is timed back to back on the device, both ends plain against both with
  PDL (:mod:`tilewright.autotune.pdl_pairs`), and PDL kept where it is faster beyond the noise.
  On a CPU there is nothing to measure (and nothing capable: the interpreter has no
  griddepcontrol); the edge's reason says so.

Both ends of an on edge are rendered with ``PDL=True``: the consumer waits (``gdc_wait`` before
its first global access) and is launched with ``launch_pdl``, the producer releases it
(``gdc_launch_dependents`` once its inputs are read). Correctness never depends on an edge:
every PDL kernel waits before touching memory, and a kernel whose predecessor never releases
starts when the predecessor ends, as without PDL. Buckets of dynamic sizes tuned at run time
launch without PDL.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable

from tilewright._config import config
from tilewright.autotune.candidates import Candidate
from tilewright.compiler.graph import ExternNode, KernelGraph, KernelNode
from tilewright.compiler.traffic import FREE_KINDS, is_free
from tilewright.templates import get_template

log = logging.getLogger("tilewright.compiler")


@dataclass
class EdgeDecision:
    """One producer → consumer launch pair and what was decided for it (times in ms)."""

    producer: str
    consumer: str
    on: bool
    reason: str
    plain_ms: float | None = None
    pdl_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def launches_nothing(node: Any) -> bool:
    """An extern node that runs no kernel (a view, a tuple access, a constant)."""
    return isinstance(node, ExternNode) and (node.kind in FREE_KINDS or is_free(node.fx_node))


def chain_edges(nodes: Iterable[Any], kernels: set[str] | None = None) -> list[tuple[str, str]]:
    """(producer, consumer) names of consecutive generated kernels in launch order. ``kernels``
    names the graph's kernel nodes (those of any registered kind, ``tilewright.kinds.kernel_nodes``);
    by default every kernel node but a :class:`KernelNode` (GEMMs and loop kernels)."""
    edges: list[tuple[str, str]] = []
    previous: str | None = None
    for n in nodes:
        kernel = getattr(n, "launches_kernel", False) and not isinstance(n, KernelNode)
        if (n.name in kernels) if kernels is not None else kernel:
            if previous is not None:
                edges.append((previous, n.name))
            previous = n.name
        elif not launches_nothing(n):
            previous = None
    return edges


def pdl_refusal(candidate: Candidate, problem: Any, target: Any) -> str | None:
    """Why ``candidate`` cannot be launched with PDL for ``problem`` on ``target`` (None: it can)."""
    template = get_template(candidate.template_id)
    if "PDL" not in template.space.names():
        return f"{template.id} has no PDL"
    return template.check({**candidate.param_dict, "PDL": True}, problem, target)


def with_pdl(candidate: Candidate, on: bool = True) -> Candidate:
    """The same candidate with ``PDL`` set (rank and prediction kept)."""
    return Candidate.of(candidate.template_id, candidate.template_hash, {**candidate.param_dict, "PDL": on},
                        rank=candidate.rank, predicted_ms=candidate.predicted_ms)


Measure = Callable[[tuple[Any, Candidate], tuple[Any, Candidate], Any], tuple[float, float, float]]


def decide(edges: list[tuple[str, str]], chosen: dict[str, tuple[Any, Candidate]], target_of: dict[str, Any],
           *, mode: str | None = None, measure: Measure | None = None) -> list[EdgeDecision]:
    """The decision for each edge. ``chosen``: kernel name → (problem, winning candidate);
    ``measure((p_problem, p_cand), (c_problem, c_cand), target) -> (plain_ms, pdl_ms, noise_ms)``
    times a pair under ``auto`` (None: nothing to measure, the edge stays off)."""
    mode = mode or config.pdl
    out = []
    for p, c in edges:
        target = target_of[c]
        why = None
        if target_of[p].name != target.name:
            why = "producer and consumer run on different devices"
        for end in (p, c):
            if why is None and (refused := pdl_refusal(chosen[end][1], chosen[end][0], target_of[end])):
                why = f"{end}: {refused}"
        if why is not None:
            out.append(EdgeDecision(p, c, False, why))
        elif mode == "off":
            out.append(EdgeDecision(p, c, False, "TILEWRIGHT_PDL=off"))
        elif mode == "on":
            out.append(EdgeDecision(p, c, True, "TILEWRIGHT_PDL=on"))
        elif measure is None:
            out.append(EdgeDecision(p, c, False, f"auto: nothing to measure the pair on ({target.name})"))
        else:
            try:
                plain, pdl, noise = measure(chosen[p], chosen[c], target)
            except Exception as e:  # noqa: BLE001 - a failed measurement costs the overlap only
                log.info("PDL pair %s -> %s not measured: %s", p, c, e)
                out.append(EdgeDecision(p, c, False, f"auto: measuring failed ({type(e).__name__}: {e})"))
                continue
            on = pdl < plain - noise
            out.append(EdgeDecision(p, c, on, f"auto: measured {'faster' if on else 'no faster'} with PDL",
                                    plain, pdl))
    return out


def pdl_kernels(decisions: Iterable[EdgeDecision]) -> set[str]:
    """Kernels rendered with ``PDL=True``: both ends of every edge that is on."""
    return {name for d in decisions if d.on for name in (d.producer, d.consumer)}


def apply_pdl(kg: KernelGraph, calls: dict[str, Any], choices: dict[str, tuple[Any, Any]],
              measure: Measure | None = None) -> list[EdgeDecision]:
    """Decide every edge of ``kg`` (``choices``: name → (problem, Selection) of the select
    stage). The render stage renders the kernels :func:`pdl_kernels` names with ``PDL=True``
    (:func:`with_pdl`). Under ``auto`` on a CUDA device the pairs are timed
    (:func:`tilewright.autotune.pdl_pairs.measure_pair`)."""
    edges = chain_edges(kg.nodes, set(calls))
    if not edges:
        return []
    chosen = {name: (problem, sel.winner) for name, (problem, sel) in choices.items()}
    target_of = {name: calls[name].target for name in calls}
    if measure is None and config.pdl == "auto" and any(t.backend == "cuda" for t in target_of.values()):
        from tilewright.autotune.pdl_pairs import measure_pair

        measure = measure_pair
    return decide([e for e in edges if e[0] in chosen and e[1] in chosen], chosen, target_of,
                  measure=measure)


def chained(kg: KernelGraph) -> set[str]:
    """Names of the generated kernels that are an end of some edge (what ``tilewright aot``
    builds with PDL where the target and template can take it)."""
    from tilewright.kinds import kernel_nodes

    kernels = {n.name for n, _ in kernel_nodes(kg)}
    return {name for edge in chain_edges(kg.nodes, kernels) for name in edge}
