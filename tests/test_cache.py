"""The tuning cache: keys change with every field, corrupt files are quarantined and rebuilt,
concurrent writers lose nothing, and a second process reuses choices without benchmarking."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import os
import subprocess
import sys
import textwrap

import pytest

from tilewright.autotune.cache import ProblemKey, Record, TuningCache
from tilewright.problem import EpilogueInput, EpilogueOp, GemmProblem

BASE = GemmProblem(M=64, N=128, K=32, dtype="bf16", layout_b="col",
                   epilogue=(EpilogueOp("add", input=0),), epilogue_inputs=(EpilogueInput("N", "bf16"),))
KEY = ProblemKey(BASE, "cpu", "2.13.0", "3.9.0", "0.1.0")


def rec(i: int = 0, **kw) -> Record:
    return Record("triton.gemm", "h", {"BLOCK_M": 16 * (i + 1)}, "ok", median_ms=1.0 + i, **kw)


@pytest.mark.parametrize("change", [
    {"problem": dataclasses.replace(BASE, M=65)},
    {"problem": dataclasses.replace(BASE, N=129)},
    {"problem": dataclasses.replace(BASE, K=33)},
    {"problem": dataclasses.replace(BASE, batch=2, batched=True)},
    {"problem": dataclasses.replace(BASE, dtype="fp16")},
    {"problem": dataclasses.replace(BASE, out_dtype="fp32")},
    {"problem": dataclasses.replace(BASE, layout_a="col")},
    {"problem": dataclasses.replace(BASE, layout_b="row")},
    {"problem": dataclasses.replace(BASE, epilogue=(EpilogueOp("add", input=0), EpilogueOp("relu")))},
    {"problem": dataclasses.replace(BASE, epilogue_inputs=(EpilogueInput("MN", "bf16"),))},
    {"problem": dataclasses.replace(BASE, dynamic=frozenset({"M"}))},
    {"target": "cuda:sm_90a"},
    {"torch_version": "2.11.0"},
    {"triton_version": "3.6.0"},
    {"tilewright_version": "0.2.0"},
    {"rules": "check=0 tf32=0 pdl=auto input_sets=3"},
], ids=lambda c: next(iter(c)) if "problem" not in c else str(c["problem"])[:40])
def test_every_key_field_changes_the_digest(change):
    assert dataclasses.replace(KEY, **change).digest != KEY.digest


def test_store_and_lookup_round_trip(tmp_path):
    cache = TuningCache(tmp_path / "t.json")
    cache.store(KEY, {"c0": rec(0), "c1": rec(1, rel_err=1e-7)})
    again = TuningCache(tmp_path / "t.json").lookup(KEY)
    assert set(again) == {"c0", "c1"} and again["c1"].rel_err == 1e-7 and again["c1"].median_ms == 2.0


@pytest.mark.parametrize("garbage", [b'{"format": "tilewright-tuning/1", "problems": [1]}',
                                     b'{\n "format": "tilewright-tuning/1",\n "problems": {\n  "ab'])
def test_corrupt_file_is_quarantined_and_rebuilt(tmp_path, garbage, caplog):
    path = tmp_path / "t.json"
    path.write_bytes(garbage)
    cache = TuningCache(path)
    assert cache.lookup(KEY) == {}
    assert any(p.name.startswith("t.json.corrupt-") for p in tmp_path.iterdir())
    assert "damaged" in caplog.text
    cache.store(KEY, {"c0": rec()})
    assert TuningCache(path).lookup(KEY)["c0"].status == "ok"


def test_truncated_file_is_quarantined(tmp_path):
    path = tmp_path / "t.json"
    TuningCache(path).store(KEY, {f"c{i}": rec(i) for i in range(5)})
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    assert TuningCache(path).lookup(KEY) == {}
    assert list(tmp_path.glob("t.json.corrupt-*"))


def _writer(path: str, who: int, n: int) -> None:
    cache = TuningCache(path)
    for i in range(n):
        key = dataclasses.replace(KEY, problem=dataclasses.replace(BASE, M=1 + i))
        cache.store(key, {f"w{who}-c{i}": rec(i)})


def test_concurrent_writers_lose_no_record(tmp_path):
    path = str(tmp_path / "t.json")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 25)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    data = json.loads(open(path).read())
    records = {ck for e in data["problems"].values() for ck in e["records"]}
    assert len(records) == 75


def test_rewrite_keeps_only_what_is_asked(tmp_path):
    cache = TuningCache(tmp_path / "t.json")
    cache.store(KEY, {"c0": rec(0), "c1": dataclasses.replace(rec(1), template_hash="stale")})
    removed, invalid = cache.rewrite(lambda entry, ck, r: r["template_hash"] != "stale")
    assert (removed, invalid) == (1, 0) and set(cache.lookup(KEY)) == {"c0"}


SCRIPT = textwrap.dedent("""
    import json, sys
    import tilewright
    from tilewright.autotune.select import select_gemm
    from tilewright.compiler.kernel_factory import TemplateKernelFactory
    from tilewright.problem import GemmProblem
    from tilewright.runtime.targets import get_target

    class Counting(TemplateKernelFactory):
        builds = 0
        def build(self, *a, **k):
            Counting.builds += 1
            return super().build(*a, **k)

    p = GemmProblem(M=40, N=48, K=24, dtype="fp32", layout_b="col")
    sel = select_gemm(p, get_target("cpu"), Counting())
    print(json.dumps({"builds": Counting.builds, "winner": sel.winner.key,
                      "cached": [r.from_cache for r in sel.results]}))
""")


@pytest.mark.slow
def test_second_process_reuses_choices_without_benchmarking(tmp_path):
    env = {**os.environ, "TILEWRIGHT_CACHE_DIR": str(tmp_path / "cache")}
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[0]["builds"] >= 1 and not any(runs[0]["cached"])
    assert runs[1]["builds"] == 0 and all(runs[1]["cached"])
    assert runs[0]["winner"] == runs[1]["winner"]



@pytest.mark.parametrize("content", [b'{"format": "tilewright-tuning-bundle/1", "records": []}',
                                     b"SQLite format 3\x00" + b"\x00" * 100])
def test_a_foreign_file_is_refused_not_moved(tmp_path, content):
    """Regression: pointing --cache at an exported bundle renamed the bundle away."""
    from tilewright.errors import CacheFileError

    path = tmp_path / "bundle"
    path.write_bytes(content)
    cache = TuningCache(path)
    with pytest.raises(CacheFileError, match="cache import"):
        cache.lookup(KEY)
    with pytest.raises(CacheFileError):
        cache.store(KEY, {"c0": rec()})
    assert path.read_bytes() == content
    assert [p for p in tmp_path.iterdir() if p.suffix != ".lock"] == [path]
