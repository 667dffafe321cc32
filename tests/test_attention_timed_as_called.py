"""The tuner times an attention candidate as the compiled graph calls it (no outputs given: the
kernel or ATen's op allocates them), after checking it into poisoned outputs. Timed into given
outputs, ATen's forward (no out= variant) was charged two copies the graph never makes and the
generated kernels none of their allocations: demo Llama's training forward tuned ATen at 0.079 ms
where the graph's call takes 0.037 ms."""

from __future__ import annotations

import tilewright
from tilewright.autotune import evaluate as ev
from tilewright.autotune.candidates import Candidate
from tilewright.compiler.kernel_factory import TemplateKernelFactory
from tilewright.kinds.attention.problem import AttentionProblem
from tilewright.templates import get_template
from tilewright.templates.aten.attention import sdpa_form


class Recording(TemplateKernelFactory):
    """The real launcher, with each call's output keywords written down."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, ...]] = []

    def build(self, problem, candidate, target):
        real = super().build(problem, candidate, target)

        def launch(*args, **outs):
            self.calls.append(tuple(sorted(k for k, v in outs.items() if v is not None)))
            return real(*args, **outs)
        return launch


def test_attention_candidates_are_timed_without_outputs():
    p = AttentionProblem(B=2, H=4, H_kv=2, Sq=24, Skv=24, D=32, Dv=32, dtype="fp32", scale=32 ** -0.5,
                         causal=True, orders=(("out", (0, 2, 1, 3)), ("lse", (0, 2, 1))), op="sdpa", empty_lse=0.0)
    assert sdpa_form(p)  # ATen's candidate is SDPA's CPU flash op, which has no out= variant
    t = get_template("aten.attention")
    factory = Recording()
    ev.forget_inputs()
    try:
        with tilewright.config.patch(bench_rep=5, bench_warmup=1, bench_min_rep=5, bench_stable_pct=0.0,
                                     bench_budget_ms=1e6):
            rec = ev.evaluate(ev.EvalTask(p, Candidate.of(t.id, t.source_hash), "cpu", "cpu"), factory).record
    finally:
        ev.forget_inputs()
    assert rec.status == "ok" and rec.reps >= 1, rec
    checked, timed = factory.calls[0], factory.calls[-rec.reps:]
    assert checked == ("lse", "out")  # the check writes into poisoned outputs
    assert all(c == () for c in timed), factory.calls  # the timed runs: as KernelCall's invoker
