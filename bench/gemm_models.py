"""Small models whose time is mostly GEMMs with epilogues, race off vs Inductor on the CPU.

    PYTHONPATH=. .venv/bin/python bench/gemm_models.py [--cases mlp,gpt2,bert,llama_bf16,llama_train]
                                                       [--repeat 3] [--json FILE]

Each case runs through :func:`tilewright.perf.cpu_suite.bench_case` (one torch thread, eager,
tilewright with the graph race on and off, and Inductor timed interleaved in one process by the
timed thread's CPU time) ``--repeat`` times; the table shows each ratio's median over the
repeats and their range, since on a shared machine one run's ratio can move by 10-30%.
``race_off/inductor`` is the generated graph's time over Inductor's (issue 29's target: <= 1.1).
The cases are the ``cpu`` suite's (``model.mlp``, ``model.gpt2``, ``model.bert``, ``demo.*``):
``tilewright bench run --suite cpu --cases model.mlp,...`` runs each once, with first calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


# short names (--cases) -> the cpu suite's cases (tilewright/perf/cpu_cases.py), one copy of each
CASES = {"mlp": "model.mlp", "gpt2": "model.gpt2", "bert": "model.bert",
         "llama_bf16": "demo.llama_bf16", "llama_train": "demo.llama_train"}


def _cases():
    from tilewright.perf.cpu_cases import find_case

    return {short: find_case("cpu", name) for short, name in CASES.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="mlp,gpt2,bert,llama_bf16,llama_train")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    from tilewright.perf.cpu_suite import RACE_OFF, bench_case

    def ratio(row, key):
        return row[key]["ratio"] if key in row else float("nan")

    cases = _cases()
    rows: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="tw-gemm-models-") as tune:
        for name in args.cases.split(","):
            for r in range(args.repeat):
                row = bench_case(cases[name], True, 1, Path(tune))
                rows.setdefault(name, []).append(row)
                imp = row["impls"]
                print(f"{name} run {r}: race_off/inductor {ratio(row, 'race_off_paired_vs_inductor'):.3f} "
                      f"race_off/eager {ratio(row, 'race_off_paired_vs_aten'):.3f} "
                      f"default/inductor {ratio(row, 'paired_vs_inductor'):.3f} "
                      f"ms eager {imp['aten'].get('ms', 0):.3f} inductor {imp.get('inductor', {}).get('ms', 0):.3f} "
                      f"race_off {imp[RACE_OFF].get('ms', 0):.3f} err {imp[RACE_OFF].get('rel_err', 0):.1e} "
                      f"dispatches {imp[RACE_OFF].get('dispatches')} choice {row['choice']}", flush=True)
    print(f"\n{'case':12} {'race_off/inductor':>22} {'race_off/eager':>22} {'default/inductor':>22}")
    for name, rs in rows.items():
        cells = []
        for key in ("race_off_paired_vs_inductor", "race_off_paired_vs_aten", "paired_vs_inductor"):
            v = [r[key]["ratio"] for r in rs if key in r]
            cells.append(f"{statistics.median(v):.3f} [{min(v):.2f}-{max(v):.2f}]" if v else "-")
        print(f"{name:12} " + " ".join(f"{c:>22}" for c in cells))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
