"""The cases of the model suites (``cpu``, ``cpu-ci``): each builds a function or a model and its
call, with torch alone, so that a first call timed in a fresh process (:mod:`.first_call`)
finds none of tilewright's compiler loaded before it starts the clock."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F


@dataclass
class Setup:
    """One case, built: ``make()`` returns a fresh model (or function) with the same weights
    each time; ``step(model)`` is one call (a training step runs forward and backward) and
    returns the value compared against eager's; ``fullgraph`` as ``torch.compile`` takes it."""

    make: Callable[[], Any]
    step: Callable[[Any], torch.Tensor]
    fullgraph: bool = False


@dataclass(frozen=True)
class Case:
    name: str
    describe: str
    build: Callable[[], Setup]


# -- the cases ----------------------------------------------------------------------------------
def _kernel(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> Setup:
    return Setup(make=lambda: fn, step=lambda f: f(*args), fullgraph=True)


def _randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=dtype)


def _rms_norm(rows: int, hidden: int) -> Setup:
    x, w = _randn(rows, hidden), _randn(hidden)

    def rms_norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    return _kernel(rms_norm, x, w)


def _softmax(rows: int, cols: int) -> Setup:
    def softmax(x):
        return torch.softmax(x, -1)
    return _kernel(softmax, _randn(rows, cols))


def _layer_norm_gelu(rows: int, hidden: int) -> Setup:
    x, w, b = _randn(rows, hidden), _randn(hidden), _randn(hidden + 1)[:hidden]

    def layer_norm_gelu(x, w, b):
        return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b))
    return _kernel(layer_norm_gelu, x, w, b)


def _scan_scatter(rows: int, cols: int) -> Setup:
    """A prefix sum along each row, values added at random columns of each row (duplicates
    included), then update rows added at random rows (duplicates included): the new-user trial's
    "cumsum + scatter_add + index_add" (issue 29)."""
    g = torch.Generator().manual_seed(rows + cols)
    index = torch.randint(0, cols, (rows, cols // 4), generator=g)
    dest = torch.randint(0, rows, (rows // 4,), generator=g)
    x, src, upd = _randn(rows, cols), _randn(rows, cols // 4), _randn(rows // 4, cols)

    def cumsum_scatter_add_index_add(x, index, src, dest, upd):
        return torch.cumsum(x, 1).scatter_add(1, index, src).index_add(0, dest, upd)
    return _kernel(cumsum_scatter_add_index_add, x, index, src, dest, upd)


class LlamaBlock(torch.nn.Module):
    """One Llama decoder layer with its rotary embedding (transformers' own modules)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, intermediate: int):
        super().__init__()
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        cfg = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=heads,
                          num_key_value_heads=kv_heads, max_position_embeddings=512,
                          attn_implementation="sdpa")
        self.layer = LlamaDecoderLayer(cfg, layer_idx=0)
        self.rotary = LlamaRotaryEmbedding(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        out = self.layer(x, position_embeddings=self.rotary(x, pos), position_ids=pos)
        return out[0] if isinstance(out, tuple) else out


def _inference(model: torch.nn.Module, call: Callable[[Any], torch.Tensor], fullgraph: bool = False) -> Setup:
    """Inference of ``model`` (copied afresh by ``make``): ``call(model)`` under no_grad."""
    def step(m):
        with torch.no_grad():
            return call(m)
    return Setup(make=lambda: copy.deepcopy(model), step=step, fullgraph=fullgraph)


def _llama_block(batch: int, seq: int, hidden: int) -> Setup:
    torch.manual_seed(0)
    block = LlamaBlock(hidden, heads=max(1, hidden // 32), kv_heads=max(1, hidden // 64),
                       intermediate=2 * hidden).eval()
    x = _randn(batch, seq, hidden)
    return _inference(block, lambda m: m(x))


# -- held-out-style models (issue 29: race off at or below 1.1x Inductor's time) ---------------
def _token_ids(batch: int, seq: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))


def _mlp(rows: int, width: int, hidden: int) -> Setup:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.GELU(),
                                torch.nn.Linear(hidden, width), torch.nn.ReLU()).eval()
    x = torch.randn(rows, width)
    return _inference(model, lambda m: m(x))


def _gpt2(batch: int, seq: int) -> Setup:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=1000, n_positions=64, n_embd=128, n_layer=2, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    ids = _token_ids(batch, seq, cfg.vocab_size)
    return _inference(GPT2LMHeadModel(cfg).eval(), lambda m: m(input_ids=ids).logits)


def _bert(batch: int, seq: int) -> Setup:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=512, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    ids = _token_ids(batch, seq, cfg.vocab_size)
    return _inference(BertModel(cfg).eval(), lambda m: m(input_ids=ids).last_hidden_state)


def _demo_minilm() -> Setup:
    from tilewright.demo import models

    model = models.load_minilm()
    feats = models.minilm_inputs(model)
    return _inference(model, lambda m: m(dict(feats))["sentence_embedding"], fullgraph=True)


def _demo_llama_bf16() -> Setup:
    from tilewright.demo import models

    model, ids = models.build_llama(torch.bfloat16).eval(), models.llama_inputs(batch=2, seq=16)
    return _inference(model, lambda m: m(input_ids=ids).logits)


def _train_step(model: torch.nn.Module, ids: torch.Tensor) -> Setup:
    def step(m):
        out = m(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.loss.detach()
    return Setup(make=lambda: copy.deepcopy(model), step=step)


def _demo_llama_train() -> Setup:
    from tilewright.demo import models

    return _train_step(models.build_llama(torch.float32), models.llama_inputs())


def _demo_qwen3_moe_train() -> Setup:
    from tilewright.demo import models
    from tilewright.demo.run import MOE_LAYERS

    return _train_step(models.build_qwen3_moe(torch.bfloat16, layers=MOE_LAYERS), models.qwen3_moe_inputs())


KERNEL_CASES = (
    Case("cpu.rms_norm", "RMSNorm, fp32 (1024, 1024)", lambda: _rms_norm(1024, 1024)),
    Case("cpu.softmax", "softmax over the last dim, fp32 (1024, 1024)", lambda: _softmax(1024, 1024)),
    Case("cpu.layer_norm_gelu", "LayerNorm then GELU, fp32 (1024, 1024)", lambda: _layer_norm_gelu(1024, 1024)),
    Case("cpu.scan_scatter", "cumsum along rows, scatter_add of 256 per row, index_add of 256 rows, fp32 (1024, 1024)",
         lambda: _scan_scatter(1024, 1024)),
    Case("cpu.llama_block", "one Llama decoder layer, fp32, 2x64 tokens, hidden 256",
         lambda: _llama_block(2, 64, 256)),
)
MODEL_CASES = (
    Case("model.mlp", "2-layer MLP fp32, 64x256 -> 1024 (GELU) -> 256 (ReLU)", lambda: _mlp(64, 256, 1024)),
    Case("model.gpt2", "GPT-2 tiny (2 layers, 128 wide, random weights) LM inference, 2x32", lambda: _gpt2(2, 32)),
    Case("model.bert", "BERT tiny (2 layers, 128 wide, random weights) inference, 2x32", lambda: _bert(2, 32)),
)
DEMO_CASES = (
    Case("demo.minilm", "all-MiniLM-L6-v2 inference (real weights), 4 sentences", _demo_minilm),
    Case("demo.llama_bf16", "demo Llama (2 layers) bf16 inference, 2x16 tokens", _demo_llama_bf16),
    Case("demo.llama_train", "demo Llama fp32 training step (forward + backward), 2x24", _demo_llama_train),
    Case("demo.qwen3_moe_train", "demo Qwen3-MoE bf16 training step (1 layer, 8 experts)",
         _demo_qwen3_moe_train),
)
CI_CASES = (
    Case("cpu.rms_norm", "RMSNorm, fp32 (256, 512)", lambda: _rms_norm(256, 512)),
    Case("cpu.softmax", "softmax over the last dim, fp32 (256, 512)", lambda: _softmax(256, 512)),
    Case("cpu.layer_norm_gelu", "LayerNorm then GELU, fp32 (256, 512)", lambda: _layer_norm_gelu(256, 512)),
    Case("cpu.scan_scatter", "cumsum along rows, scatter_add of 128 per row, index_add of 64 rows, fp32 (256, 512)",
         lambda: _scan_scatter(256, 512)),
    Case("cpu.llama_block", "one Llama decoder layer, fp32, 1x32 tokens, hidden 128",
         lambda: _llama_block(1, 32, 128)),
    MODEL_CASES[0],  # the MLP: two GEMMs with their epilogues, ~1 s to a first call
)

MODEL_SUITES: dict[str, tuple[tuple[Case, ...], bool, bool]] = {
    "cpu": (KERNEL_CASES + MODEL_CASES + DEMO_CASES, True, True),
    "cpu-ci": (CI_CASES, False, False),
}
"""Suite name -> (cases, whether Inductor is compiled and timed beside by default, whether first
calls are timed each in a fresh process by default). ``cpu-ci`` (CI) times them in process: a
fresh process per case would add 5-10 s each on the 2-core CI machine (Python, torch and the
case built again)."""


def find_case(suite: str, name: str) -> Case:
    """The case ``name`` of ``suite``.

    Raises:
        KeyError: an unknown suite or case (the message lists the suite's cases).
    """
    for case in MODEL_SUITES[suite][0]:
        if case.name == name:
            return case
    raise KeyError(f"suite {suite!r} has no case {name!r}: {[c.name for c in MODEL_SUITES[suite][0]]}")
