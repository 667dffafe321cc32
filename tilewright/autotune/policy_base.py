"""The one skeleton every candidate policy shares: ATen first, then each template's legal
settings ranked by the kind's cost estimate, within a budget.

A kind's policy (``kinds/<kind>/policy.py``) subclasses :class:`CandidatePolicy` and fills in
what differs between kinds; :meth:`CandidatePolicy.candidates` is written once:

1. :meth:`~CandidatePolicy.head`: the ATen template as rank 0 (what the tuner must beat), with
   the kind's own prediction of its time (:meth:`~CandidatePolicy.aten_ms`);
2. on an interpreted target (the CPU) in ``auto`` mode, nothing else, unless the policy says
   interpreted kernels may win there (:attr:`~CandidatePolicy.interpreted_aten_only`);
3. each template of the problem's kind for the target (``templates_for(problem.kind, ...)``)
   that :meth:`~CandidatePolicy.offers` it: its settings from :meth:`~CandidatePolicy.options`
   (by default :meth:`~CandidatePolicy.ranked`: the template's proposals completed with its
   defaults, deduplicated, those its ``check`` refuses dropped, scored by
   :meth:`~CandidatePolicy.estimate`, best first);
4. :meth:`~CandidatePolicy.choose` picks at most ``budget`` of them (by default the fastest
   predicted), and they follow ATen in that order, each ranked after the one before.

``ranked`` is also what ``tilewright aot`` builds from (no device to measure on: the predicted
best settings of each template).
"""

from __future__ import annotations

from typing import Any, Iterable

from tilewright._config import config
from tilewright.autotune.candidates import Candidate
from tilewright.runtime.languages import pinned_knobs
from tilewright.runtime.targets import Target
from tilewright.templates import TemplateSpec, get_template, templates_for

Scored = tuple[float, dict[str, Any]]
"""(predicted ms, params) of one setting of one template."""

Choice = tuple[float | None, TemplateSpec, dict[str, Any]]
"""(predicted ms or None, template, params): one generated candidate before it is ranked."""


class CandidatePolicy:
    """Base of the candidate policies (see the module docstring for the skeleton).

    Attributes:
        max_candidates: the most generated candidates (None: ``config.max_candidates``; the
            smaller of the two when both are set).
        interpreted_aten_only: on an interpreted target in ``auto`` mode, offer ATen alone
            (interpreted kernels run Python per tile: they only lose to ATen, and a stalled
            ATen measurement on a loaded machine could cache a far slower choice; forcing a
            backend still offers them).
    """

    max_candidates: int | None = None
    interpreted_aten_only: bool = True

    # -- ATen, rank 0 -------------------------------------------------------------------------------
    def aten_ms(self, problem: Any, target: Target) -> float | None:
        """ATen's predicted time in ms (None: no prediction). Default: none."""
        return None

    def head(self, problem: Any, target: Target) -> list[Candidate]:
        """The candidates before the generated ones: the ATen template ``aten.<problem.kind>``
        at rank 0."""
        aten = get_template(f"aten.{problem.kind}")
        return [Candidate.of(aten.id, aten.source_hash, {}, rank=0, predicted_ms=self.aten_ms(problem, target))]

    # -- one template's settings ---------------------------------------------------------------------
    def offers(self, template: TemplateSpec, problem: Any, target: Target) -> bool:
        """Whether ``template``'s kernels are offered for ``problem``: a generated template
        (not ATen's) that supports it."""
        return template.backend != "aten" and bool(template.supports(problem, target))

    def proposals(self, problem: Any, target: Target, template: TemplateSpec) -> Iterable[dict[str, Any]]:
        """Settings to try, before completion and checking. Default: the template's own
        ``seed_params(problem, target)`` (none when it has none)."""
        return template.seed_params(problem, target) or []

    def legal(self, problem: Any, target: Target, template: TemplateSpec,
              proposals: Iterable[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The distinct proposals (default :meth:`proposals`) completed with the template's
        defaults (knobs it does not have dropped), with the knobs the template's compiler needs
        on this backend pinned (``Language.pinned_knobs``: Triton's AMD pipeliner wants 2
        stages), that its ``check`` accepts, in proposal order."""
        names = set(template.space.names())
        pinned = {k: v for k, v in pinned_knobs(template.backend, target.backend).items() if k in names}
        seen, out = set(), []
        for p in self.proposals(problem, target, template) if proposals is None else proposals:
            params = template.space.complete({k: v for k, v in p.items() if k in names} | pinned)
            key = tuple(sorted(params.items()))
            if key in seen or template.check(params, problem, target):
                continue
            seen.add(key)
            out.append(params)
        return out

    def estimate(self, problem: Any, params: dict[str, Any], target: Target, template: TemplateSpec) -> float:
        """The predicted time in ms of ``template``'s kernel with ``params``."""
        raise NotImplementedError(f"{type(self).__name__} has no cost estimate")

    def ranked(self, problem: Any, target: Target, template: TemplateSpec) -> list[Scored]:
        """(predicted ms, params) for one template's legal settings, best first."""
        scored = [(self.estimate(problem, p, target, template), p) for p in self.legal(problem, target, template)]
        return sorted(scored, key=lambda item: item[0])

    def options(self, problem: Any, target: Target, template: TemplateSpec) -> list[tuple[float | None, dict]]:
        """What ``template`` puts forward for :meth:`choose`, in the policy's order of
        preference. Default: :meth:`ranked`."""
        return self.ranked(problem, target, template)

    # -- the whole list ------------------------------------------------------------------------------
    def templates_kind(self, problem: Any) -> str:
        """Whose templates are offered: ``problem.kind``'s."""
        return problem.kind

    def choose(self, per_template: list[tuple[TemplateSpec, list]], problem: Any, target: Target,
               budget: int) -> list[Choice]:
        """At most ``budget`` of the templates' options, in candidate order. Default: the
        fastest predicted (a stable sort: equal predictions keep template order)."""
        everything = [(ms, t, p) for t, options in per_template for ms, p in options]
        everything.sort(key=lambda item: item[0])
        return everything[:budget]

    def budget(self) -> int:
        """The most generated candidates: ``config.max_candidates``, or :attr:`max_candidates`
        when smaller."""
        return min(config.max_candidates, self.max_candidates or config.max_candidates)

    def candidates(self, problem: Any, target: Target,
                   templates: Iterable[TemplateSpec] | None = None) -> list[Candidate]:
        """Ranked candidates: :meth:`head` (ATen, rank 0) first, then at most :meth:`budget`
        generated kernels chosen by :meth:`choose` (``templates``: those to consider instead
        of every template of the problem's kind on the target)."""
        out = self.head(problem, target)
        if self.interpreted_aten_only and target.interpreted and config.force_backend == "auto":
            return out
        per_template = []
        for template in templates if templates is not None else templates_for(
                self.templates_kind(problem), target.backend, jit=True):
            if not self.offers(template, problem, target):
                continue
            options = self.options(problem, target, template)
            if options:
                per_template.append((template, options))
        for ms, template, params in self.choose(per_template, problem, target, self.budget()):
            out.append(Candidate.of(template.id, template.source_hash, params, rank=len(out), predicted_ms=ms))
        return out


__all__ = ["CandidatePolicy", "Choice", "Scored"]
