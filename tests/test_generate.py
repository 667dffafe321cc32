"""transformers' ``model.generate()`` end to end with ``model.forward`` compiled by tilewright:
tiny random Llama, Qwen3 and Mistral (sliding window) models, greedy, a left-padded prompt, with
the dynamic cache and with ``cache_implementation="static"``. Tokens identical to eager, no graph
falls back, and with generated kernels forced every attention (prefill and decode, the dynamic
graph's included) and every GEMM is a generated kernel; the graphs compiled over the generation
are counted beside Dynamo's own count for any backend (Inductor's included: the backend adds no
recompile) and printed; each kernel is tuned once per bucket, never per token."""

from __future__ import annotations

import collections

import pytest
import torch

import tilewright
from tilewright.compiler.report import collect_reports

transformers = pytest.importorskip("transformers")

NEW_TOKENS = 6  # prompt 7 + 6: the third call is Dynamo's dynamic graph, lengths 9..12 one bucket


def tiny(name: str) -> torch.nn.Module:
    """A random 2-layer model of hidden size 64 (4 query heads, 2 KV heads), in eval mode."""
    torch.manual_seed(0)
    kw = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    if name == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw))
    elif name == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=16, **kw))
    else:  # a window shorter than the generation: the mask drops early keys in decode
        model = transformers.MistralForCausalLM(transformers.MistralConfig(sliding_window=8, **kw))
    return model.eval()


def prompt() -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of 7 tokens, the second left-padded by 3."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 128, (2, 7), generator=gen)
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0
    return ids, mask


def generate(model, cache: str) -> torch.Tensor:
    ids, mask = prompt()
    kw = {"cache_implementation": "static"} if cache == "static" else {}
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                              pad_token_id=0, **kw)


def dynamo_graph_count(name: str, cache: str) -> int:
    """Graphs Dynamo compiles for the same generation with a counting backend."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    model, counter = tiny(name), CompileCounter()
    model.forward = torch.compile(model.forward, backend=counter)
    generate(model, cache)
    torch._dynamo.reset()
    return counter.frame_count


@pytest.mark.slow
@pytest.mark.parametrize("name,cache,force", [
    ("llama", "dynamic", "triton"),
    ("qwen3", "static", "triton"),
    ("mistral", "dynamic", "triton"),
    ("qwen3", "dynamic", "auto"),
])
def test_generate_matches_eager_on_generated_kernels(name, cache, force, monkeypatch):
    from tilewright.compiler import dispatch

    want = generate(tiny(name), cache)
    tuned = collections.Counter()  # (kernel call, bucket) -> times tuned
    real = dispatch.KernelCall._select_bucket

    def counting(self, problem, sizes):
        tuned[(id(self), tuple(sorted(self._sizes_of(problem).items())))] += 1
        return real(self, problem, sizes)

    monkeypatch.setattr(dispatch.KernelCall, "_select_bucket", counting)
    model = tiny(name)
    model.forward = torch.compile(model.forward, backend="tilewright")
    with tilewright.config.patch(force_backend=force), collect_reports() as reports:
        got = generate(model, cache)
    assert torch.equal(got, want), (got, want)
    assert not [r.fallback for r in reports if r.fallback]
    theirs = dynamo_graph_count(name, cache)
    print(f"\n{name} {cache} cache, {force}: {len(reports)} graphs compiled by tilewright, "
          f"{theirs} by Dynamo for any backend (Inductor's count)")
    assert len(reports) <= theirs
    # every kernel is tuned once per bucket, never per token: the dynamic graph's lengths 9..12
    # (and the positions 8..11 before them) span at most two buckets per size
    assert max(tuned.values(), default=0) == 1, [k for k, n in tuned.items() if n > 1]
    per_call = collections.Counter(call for call, _ in tuned)
    assert max(per_call.values(), default=0) <= 2, per_call
    if force == "auto":
        return
    attention = [k for r in reports for k in r.kernels if k.kind == "attention"]
    assert len(attention) == 2 * len(reports), [(r.graph_id, r.kernel_counts) for r in reports]
    assert all(k.winner.startswith("triton.attention") for k in attention), [k.winner for k in attention]
    assert all(not g.winner.startswith("aten") for r in reports for g in r.gemms), \
        [g.winner for r in reports for g in r.gemms]
    if cache == "dynamic" and name != "mistral":  # Mistral's cache holds the window: its KV stays 8
        assert any("dynamic" in k.problem for k in attention), "the dynamic decode graph's attention"
    assert sum(r.extern_ops for r in reports) == 0, [(r.graph_id, r.extern_ops) for r in reports]
