"""Small models whose time is mostly GEMMs with epilogues, race off vs Inductor on the CPU.

    PYTHONPATH=. .venv/bin/python bench/gemm_models.py [--cases mlp,gpt2,bert,llama_bf16,llama_train]
                                                       [--repeat 3] [--json FILE]

Each case runs through :func:`tilewright.perf.cpu_suite.bench_case` (one torch thread, eager,
tilewright with the graph race on and off, and Inductor timed interleaved in one process by the
timed thread's CPU time) ``--repeat`` times; the table shows each ratio's median over the
repeats and their range, since on a shared machine one run's ratio can move by 10-30%.
``race_off/inductor`` is the generated graph's time over Inductor's (issue 29's target: <= 1.1).
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


def _cases():
    import torch

    from tilewright.perf.cpu_cases import Case, Setup, find_case

    def mlp() -> Setup:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                                    torch.nn.Linear(1024, 256), torch.nn.ReLU()).eval()
        x = torch.randn(64, 256)

        def step(m):
            with torch.no_grad():
                return m(x)
        return Setup(make=lambda: __import__("copy").deepcopy(model), step=step)

    def gpt2() -> Setup:
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        cfg = GPT2Config(vocab_size=1000, n_positions=64, n_embd=128, n_layer=2, n_head=4,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = GPT2LMHeadModel(cfg).eval()
        ids = torch.randint(0, 1000, (2, 32), generator=torch.Generator().manual_seed(0))

        def step(m):
            with torch.no_grad():
                return m(input_ids=ids).logits
        return Setup(make=lambda: __import__("copy").deepcopy(model), step=step)

    def bert() -> Setup:
        from transformers import BertConfig, BertModel

        torch.manual_seed(0)
        cfg = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=512, max_position_embeddings=64, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)
        model = BertModel(cfg).eval()
        ids = torch.randint(0, 1000, (2, 32), generator=torch.Generator().manual_seed(0))

        def step(m):
            with torch.no_grad():
                return m(input_ids=ids).last_hidden_state
        return Setup(make=lambda: __import__("copy").deepcopy(model), step=step)

    return {
        "mlp": Case("mlp", "2-layer MLP fp32, 64x256 -> 1024 (GELU) -> 256 (ReLU)", mlp),
        "gpt2": Case("gpt2", "GPT-2 tiny (2 layers, 128 wide) LM inference, 2x32", gpt2),
        "bert": Case("bert", "BERT tiny (2 layers, 128 wide) inference, 2x32", bert),
        "llama_bf16": find_case("cpu", "demo.llama_bf16"),
        "llama_train": find_case("cpu", "demo.llama_train"),
    }


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
