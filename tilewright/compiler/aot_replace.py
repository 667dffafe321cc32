"""A failed candidate of an ahead-of-time build costs itself, not the model.

``tilewright aot`` builds each template's best-ranked settings per (target, problem). Nothing
is timed there, so the ranking is a model's guess, and a guess can spill registers (Triton's
16x32x128 tile with one warp and three stages did on sm_90a and sm_100a for a 64x96 @ 96x80
fp32 GEMM), crash its compiler or fail its instruction check. Such a candidate is replaced by
the next setting of the same template's ranking that has not been tried, built and checked in
turn (a few rounds at most), and every failure whose problem another kernel serves on the same
target is *dropped*: kept in the manifest with its reason and what replaced it, left out of the
build's verdict. Only a (target, problem) that no kernel serves at all still fails the build.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from tilewright.kinds import kind_of

log = logging.getLogger("tilewright.aot")

ROUNDS = 3
"""Most replacement rounds: each builds at most one new setting per failed (target, problem,
template)."""


def _why(k: Any) -> str:
    if not (k.result and k.result.ok):
        status = k.result.status if k.result else "not built"
        text = (k.result.error if k.result else "").strip()
        return f"{status}: {text.splitlines()[-1][:200] if text else '-'}"
    return "; ".join(k.verify_failures) or "failed its check"


def _next_setting(group: list[Any], tried: set[str]) -> Any | None:
    """The best-ranked setting of the group's template not built yet, as a kernel, or None."""
    from tilewright.compiler.aot import _kernel_name, chain_pdl, make_kernel

    first = group[0]
    cap, target, template = first.captured, first.target, first.template
    for ms, params in kind_of(cap.problem).ranked(cap.problem, target, template):
        name = _kernel_name(target, cap, template, chain_pdl(cap, template, params, target))
        if name in tried:
            continue
        try:
            return make_kernel(cap, target, template, ms, params)
        except Exception as e:  # noqa: BLE001 - a setting that cannot render is one more failure
            tried.add(name)
            log.info("aot: %s cannot be rendered (%s: %s)", name, type(e).__name__, e)
    return None


def replace_failures(kernels: list[Any], land: Callable[[list[Any]], None], rounds: int = ROUNDS) -> list[Any]:
    """Build replacements for the failed kernels of ``kernels`` (``land(batch)`` compiles and
    checks a batch in place) and mark every failure another kernel covers as dropped. Returns
    the kernels it added (in ``kernels``' order of problems)."""
    from tilewright.compiler.aot import describe_params

    added: list[Any] = []
    tried = {k.name for k in kernels}
    for _ in range(rounds):
        groups: dict[tuple, list[Any]] = {}
        for k in kernels + added:
            groups.setdefault((k.target.name, id(k.captured), k.template.id), []).append(k)
        batch = []
        for group in groups.values():
            if any(k.good for k in group) or not any(k.job for k in group):
                continue
            k = _next_setting(group, tried)
            if k is not None:
                tried.add(k.name)
                batch.append(k)
        if not batch:
            break
        land(batch)
        added += batch

    everything = kernels + added
    for k in everything:
        if k.good:
            continue
        same = [o for o in everything if o.good and o.target.name == k.target.name and o.captured is k.captured]
        if not same:
            continue  # nothing serves this problem on this target: the failure stands
        best = next((o for o in same if o.template.id == k.template.id), same[0])
        k.dropped = (f"{_why(k)}; replaced by {best.template.id} {describe_params(best.params, best.template)}")
        log.warning("aot: %s dropped (%s)", k.name, k.dropped)
    return added
