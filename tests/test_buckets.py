"""The dynamic-shape policy: powers of two up to a cap, pre-tuning every bucket up to the
trace-time size, and run-time dispatch to the bucket of the actual size."""

from __future__ import annotations

import warnings

import torch
from fakes import Behaviour, FakeFactory, FakePolicy

import tilewright
from tilewright.autotune import select as select_mod
from tilewright.autotune.buckets import all_buckets, bucket, buckets_up_to
from tilewright.compiler.dispatch import KernelCall
from tilewright.problem import GemmProblem
from tilewright.runtime.targets import get_target


def test_buckets_are_powers_of_two_up_to_the_cap():
    assert [bucket(n) for n in (0, 1, 2, 3, 5, 64, 65)] == [0, 1, 2, 4, 8, 64, 128]
    with tilewright.config.patch(bucket_max=1000):
        assert bucket(5000) == 1024 and bucket(1024) == 1024 and bucket(700) == 1024
    assert buckets_up_to(100) == [1, 2, 4, 8, 16, 32, 64, 128]


def test_all_buckets_of_static_and_dynamic_problems():
    static = GemmProblem(M=100, N=8, K=8, dtype="fp32")
    assert all_buckets(static) == [static]
    dyn = GemmProblem(M=5, N=8, K=8, dtype="fp32", dynamic=frozenset({"M"}))
    assert [p.M for p in all_buckets(dyn)] == [1, 2, 4, 8]
    assert [p.M for p in all_buckets(dyn, {"M": 2})] == [1, 2]


def _call(monkeypatch):
    monkeypatch.setattr(select_mod, "policy_for", lambda op, t: FakePolicy(["aten", "x"]))
    factory = FakeFactory({"aten": Behaviour("good", 2.0), "x": Behaviour("good", 1.0)})
    p = GemmProblem(M=12, N=8, K=16, dtype="fp32", dynamic=frozenset({"M"}))
    return KernelCall("gemm_0", p, get_target("cpu"), factory), factory


def test_pretune_tunes_every_bucket_up_to_the_trace_size(monkeypatch, fresh_cache):
    call, _ = _call(monkeypatch)
    with tilewright.config.patch(pretune_buckets=True):
        sel = call.prepare()
    assert sel.problem.M == 16, "the trace-time bucket comes first (reports show it)"
    assert sorted(k[0] for k in call.selections) == [1, 2, 4, 8, 16]


def test_runtime_sizes_dispatch_to_their_bucket(monkeypatch, fresh_cache):
    call, _ = _call(monkeypatch)
    call.prepare()
    assert sorted(k[0] for k in call.selections) == [16]
    for M in (9, 16, 3, 40):
        out = call(torch.randn(M, 16), torch.randn(16, 8))
        assert out.shape == (M, 8)
    assert sorted(k[0] for k in call.selections) == [4, 16, 64]


def test_the_last_buckets_launcher_is_reused_until_a_launcher_changes(monkeypatch, fresh_cache):
    call, _ = _call(monkeypatch)
    call.prepare()
    b = torch.randn(16, 8)
    lookups = []
    real_key = KernelCall._key
    monkeypatch.setattr(KernelCall, "_key", lambda self, sizes: lookups.append(sizes["M"]) or real_key(self, sizes))
    for M in (9, 12, 16, 16, 17, 40, 33, 64, 65, 3):  # a decode loop's sizes, a few bucket edges
        out = call(torch.randn(M, 16), b)
        assert out.shape == (M, 8)
    # a lookup only where the bucket changed: 9 (first), 17 (-> 32), 40 (-> 64), 65 (-> 128), 3 (-> 4)
    assert lookups == [9, 17, 40, 65, 3]
    (_, ranges, launch) = call._recent
    assert ranges == (("M", 2, 4),) and launch is call._launchers[call._key({"M": 3})]
    # a rescue (the bucket now on ATen) drops the memo: the next call finds the new launcher
    a = torch.randn(3, 16)
    with tilewright.config.patch(strict=False), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning: what it says is tested elsewhere
        replaced = call.rescue({"M": 3}, RuntimeError("injected"), stage="run")
    assert call._recent is None
    out = call(a, b)
    assert call._recent[2] is replaced is call._launchers[call._key({"M": 3})]
    assert torch.allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    # a size past the cap shares the cap's bucket, unbounded above
    with tilewright.config.patch(bucket_max=64):
        call(torch.randn(100, 16), b)
        assert call._recent[1] == (("M", 32, float("inf")),)
        call(torch.randn(700, 16), b)
    assert lookups[-2:] == [3, 100]  # 700: no lookup (the cap's bucket); 100: bucket_max changed
