"""The ``decode`` bench suite (perf/decode_suite.py, perf/decode_cases.py)."""

from __future__ import annotations

import json

import pytest
import torch

from tilewright import config

transformers = pytest.importorskip("transformers")


def test_a_decode_step_computes_the_same_step_every_call():
    """Each timed call must be the same work: transformers 5 appends at the cache's own length,
    which the step rewinds; without the rewind a second call attends to one more position."""
    from tilewright.perf import decode_cases as dc

    case = dc.find_case("decode.llama.step")
    cpu = torch.device("cpu")
    model = dc.build_model("llama", torch.float32, cpu)
    x = dc.inputs(case, cpu)
    step = dc.side_step(case, model, dc.forward_fn(model), x, torch.float32, cpu)
    first, second = step().clone(), step().clone()
    assert torch.equal(first, second)
    assert first.shape == (1, 1, dc.VOCAB)
    if not hasattr(dc.static_cache(model, 8, torch.float32, cpu), "layers"):
        return  # transformers 4 writes at cache_position: nothing to rewind
    unwound = dc.side_step(case, model, dc.forward_fn(model), x, torch.float32, cpu)
    unwound()
    import unittest.mock as mock

    with mock.patch.object(dc, "rewind", lambda cache, length: None):
        assert not torch.equal(unwound(), first)


def test_a_generation_loop_grows_its_cache_and_repeats_the_same_work_every_call():
    """The generate case decodes GENERATE tokens on a DynamicCache; each call starts again from
    the prompt (the cache cropped back), so every call computes the same logits."""
    from tilewright.perf import decode_cases as dc

    case = dc.find_case("decode.llama.generate")
    cpu = torch.device("cpu")
    model = dc.build_model("llama", torch.float32, cpu)
    x = dc.inputs(case, cpu)
    assert x.ids.shape == (1, dc.GENERATE) and x.positions[0] == dc.PROMPT
    step = dc.side_step(case, model, dc.forward_fn(model), x, torch.float32, cpu)
    first, second = step().clone(), step().clone()
    assert torch.equal(first, second) and first.shape == (1, 1, dc.VOCAB)
    # the same as decoding the tokens after a fresh prefill, eagerly
    from transformers import DynamicCache

    cache, fwd = DynamicCache(), dc.forward_fn(model)
    with torch.no_grad():
        fwd(x.prompt, torch.arange(dc.PROMPT), cache)
        for i in range(dc.GENERATE):
            ref = fwd(x.ids[:, i:i + 1], x.positions[i:i + 1], cache)
    assert torch.allclose(first, ref, rtol=1e-5, atol=1e-5)
    assert cache.get_seq_length() == dc.PROMPT + dc.GENERATE


@pytest.mark.slow
def test_the_generation_loop_compiles_dynamic_and_matches_eager(tmp_path):
    from tilewright.perf.decode_suite import run_decode_suite

    with config.patch(bench_rep=3, bench_min_rep=3, bench_budget_ms=5.0, cache_dir=str(tmp_path / "tw")):
        doc = run_decode_suite(device="cpu", inductor=False, cases=("decode.llama.generate",))
    (row,) = doc["results"]
    for side in ("tilewright", "tilewright-race-off"):
        assert row["impls"][side]["rel_err"] < 1e-5 and row["impls"][side]["ms"] > 0, row["impls"][side]
    assert not row["fallbacks"]


def test_bench_show_prints_a_decode_document(tmp_path, capsys):
    from tilewright.cli.main import main

    doc = {"format": "tilewright-bench/1", "suite": "decode", "complete": True,
           "env": {"target": "cpu", "arch": "x86_64", "device": "x86_64", "versions": {"torch": "2.x"}},
           "settings": {"dtype": "float32"},
           "results": [{"id": "decode.llama.step", "impls": {
               "aten": {"ms": 1.5, "rel_err": 0.0}, "tilewright": {"ms": 1.2, "rel_err": 1e-7},
               "tilewright-race-off": {"ms": 1.1}, "inductor": {"error": "RuntimeError: boom"}},
               "paired": {"tilewright": 0.8, "tilewright-race-off": 0.73},
               "race": [{"graph": "inference 0", "winner": "compiled"}], "cudagraphs": []}]}
    path = tmp_path / "decode.json"
    path.write_text(json.dumps(doc))
    assert main(["bench", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "decode.llama.step" in out and "0.80x" in out and "0.73x" in out
    assert "RuntimeError: boom" in out and "inference 0: compiled" in out


@pytest.mark.slow
def test_the_decode_suite_times_eager_tilewright_and_race_off_side_by_side(tmp_path):
    from tilewright.perf.decode_suite import run_decode_suite

    out = tmp_path / "decode.json"
    with config.patch(bench_rep=6, bench_min_rep=3, bench_budget_ms=5.0, cache_dir=str(tmp_path / "tw")):
        doc = run_decode_suite(device="cpu", inductor=False, cases=("decode.llama.step",), out=out)
    assert json.loads(out.read_text())["results"] == json.loads(json.dumps(doc["results"]))
    (row,) = doc["results"]
    assert set(row["impls"]) == {"aten", "tilewright", "tilewright-race-off"}, row
    for side in ("tilewright", "tilewright-race-off"):
        assert row["impls"][side]["rel_err"] < 1e-5 and row["impls"][side]["ms"] > 0
        assert row["paired"][side] > 0
    assert row["paired_vs_aten"]["pairs"] == row["impls"]["aten"]["reps"]
    assert row["graphs"] >= 1 and not row["fallbacks"]
    assert row["race"] and all(r["winner"] in ("compiled", "aten") for r in row["race"])
    assert doc["settings"]["clock"] == "thread CPU time" and doc["complete"]


def test_bench_run_routes_the_decode_suite(tmp_path, monkeypatch, capsys):
    """``bench run --suite decode`` reaches the decode runner with the CLI's choices (the
    runner itself is timed by the slow test; here it is replaced, to check the routing)."""
    from tilewright.cli.main import main
    from tilewright.perf import decode_suite

    seen = {}

    def fake_run(**kwargs):
        seen.update(kwargs)
        return {"suite": "decode", "skipped": [], "settings": {"dtype": "float32"}, "results": [],
                "env": {"target": "cpu", "device": "x86_64", "versions": {"torch": "2.x"}}}

    monkeypatch.setattr(decode_suite, "run_decode_suite", fake_run)
    out = tmp_path / "d.json"
    assert main(["bench", "run", "--suite", "decode", "--target", "cpu", "--cases", "decode.llama.step",
                 "--out", str(out), "--time-budget-s", "30"]) == 0
    assert seen["device"] == "cpu" and seen["cases"] == ("decode.llama.step",)
    assert seen["time_budget_s"] == 30 and seen["out"] == out and seen["inductor"] is True
    assert "suite decode" in capsys.readouterr().out


def test_the_one_line_summary_names_each_sides_ratio_and_the_replays():
    from tilewright.perf.decode_suite import decode_summary

    doc = {"results": [
        {"id": "decode.llama.step", "paired": {"tilewright": 0.9, "tilewright-cudagraphs": 0.31},
         "cudagraphs": [{"graph": "inference 0", "status": "on", "replays": 40}]},
        {"id": "decode.qwen3.step", "error": "RuntimeError: boom"}], "skipped": ["decode.qwen3.prefill"]}
    head, detail = decode_summary(doc)
    assert head == "1/3 cases"
    assert detail == "llama.step: tw 0.90x, tw+CG 0.31x (40 replays); failed: decode.qwen3.step"
