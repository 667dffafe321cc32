"""The cases of the ``decode`` suite: one decode step and one prefill of tiny random Llama and
Qwen3 models (transformers' own modules, random weights, no downloads).

A decode step is one token against a static KV cache of ``PROMPT`` positions (prefilled once,
eagerly), as a serving loop or ``generate(cache_implementation="static")`` runs it: static shapes,
the cache tensors at fixed addresses (``mark_static_address``), which is what CUDA graphs need.
The step writes its token's keys and values into the cache; transformers >= 5 appends at the
cache's own length counter, so each timed call first sets that counter back to ``PROMPT``
(outside the compiled code, the same for every side), and every call computes the same step.
A prefill is ``PROMPT_PREFILL`` tokens through the model without a cache.

A generation loop (``generate``) is what ``model.generate()`` runs by default: ``GENERATE``
tokens one at a time on a ``DynamicCache`` (prefilled once with the prompt, eagerly, and cropped
back to it before each timed call), so the KV length grows every step and Dynamo compiles the
step with dynamic shapes after the first size change: the graphs' loop kernels and attention
dispatch on the run-time length (size buckets). The tokens are given (random, teacher-forced),
so every side and every call does the same work.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch

PROMPT = 256
"""Positions in the KV cache before the decode step (the step attends to PROMPT + 1)."""
MAX_CACHE = 320
"""The static cache's length (positions past the step's are masked)."""
PROMPT_PREFILL = 128
GENERATE = 8
"""Tokens one ``generate`` call decodes, one at a time."""
VOCAB = 1024


@dataclass(frozen=True)
class DecodeCase:
    """``model``: "llama" or "qwen3"; ``phase``: "decode" (one token, KV cache of PROMPT
    positions), "prefill" (PROMPT_PREFILL tokens, no cache) or "generate" (GENERATE tokens one
    at a time on a DynamicCache growing from PROMPT positions)."""

    name: str
    describe: str
    model: str
    phase: str


CASES = (
    DecodeCase("decode.llama.step", f"tiny Llama (2 layers, hidden 128, GQA 4/2): one token, "
               f"static KV cache of {PROMPT} positions", "llama", "decode"),
    DecodeCase("decode.llama.prefill", f"tiny Llama: prefill of {PROMPT_PREFILL} tokens, no cache",
               "llama", "prefill"),
    DecodeCase("decode.qwen3.step", f"tiny Qwen3 (2 layers, hidden 128, q/k norm, GQA 4/2): one token, "
               f"static KV cache of {PROMPT} positions", "qwen3", "decode"),
    DecodeCase("decode.qwen3.prefill", f"tiny Qwen3: prefill of {PROMPT_PREFILL} tokens, no cache",
               "qwen3", "prefill"),
    DecodeCase("decode.llama.generate", f"tiny Llama: {GENERATE} tokens one at a time on a DynamicCache "
               f"from {PROMPT} positions (the KV length grows: dynamic shapes)", "llama", "generate"),
)


def find_case(name: str) -> DecodeCase:
    """The case ``name``.

    Raises:
        KeyError: no such case (the message lists them).
    """
    for case in CASES:
        if case.name == name:
            return case
    raise KeyError(f"the decode suite has no case {name!r}: {[c.name for c in CASES]}")


def build_model(kind: str, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """A tiny random ``LlamaForCausalLM`` or ``Qwen3ForCausalLM`` (seeded: the same weights on
    every call), in eval mode, SDPA attention."""
    import transformers

    common = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    if kind == "llama":
        cfg, cls = transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
    elif kind == "qwen3":
        cfg, cls = transformers.Qwen3Config(head_dim=32, **common), transformers.Qwen3ForCausalLM
    else:
        raise KeyError(f"no tiny model {kind!r}: llama, qwen3")
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return cls(cfg).to(device=device, dtype=dtype).eval()


def static_cache(model: torch.nn.Module, max_len: int, dtype: torch.dtype, device: torch.device) -> Any:
    """An empty ``StaticCache`` for ``model`` (transformers 5's signature, else 4's)."""
    from transformers import StaticCache

    try:
        return StaticCache(config=model.config, max_cache_len=max_len)
    except TypeError:  # transformers 4: the batch, device and dtype up front
        return StaticCache(config=model.config, max_batch_size=1, max_cache_len=max_len, device=device,
                           dtype=dtype)


def _params(model: torch.nn.Module) -> set[str]:
    return set(inspect.signature(model.forward).parameters)


def forward_fn(model: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """``f(ids, positions, cache) -> logits``: the model's call as a function of tensors and the
    cache (what the sides compile), with the cache keyword of the installed transformers."""
    params = _params(model)
    cache_kw = "cache" if "cache" in params else "past_key_values"
    with_position = "cache_position" in params  # transformers 4 writes the cache where told

    def forward(ids: torch.Tensor, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        kwargs: dict[str, Any] = {"position_ids": positions[None]}
        if cache is not None:
            kwargs |= {cache_kw: cache, "use_cache": True}
            if with_position:
                kwargs["cache_position"] = positions
        else:
            kwargs["use_cache"] = False
        return model(input_ids=ids, **kwargs).logits
    return forward


def rewind(cache: Any, length: int) -> None:
    """Set a static cache's length back to ``length`` (transformers 5 appends at its layers'
    ``cumulative_length``; transformers 4 writes at ``cache_position`` and needs nothing)."""
    for layer in getattr(cache, "layers", ()):
        counter = getattr(layer, "cumulative_length", None)
        if isinstance(counter, torch.Tensor):
            counter.fill_(length)


@dataclass
class Inputs:
    """One case's inputs on ``device``: the token ids and positions of the call, and for a
    decode step the prompt that fills each side's cache first."""

    ids: torch.Tensor
    positions: torch.Tensor
    prompt: torch.Tensor | None


def inputs(case: DecodeCase, device: torch.device) -> Inputs:
    g = torch.Generator().manual_seed(1)
    if case.phase == "generate":  # GENERATE tokens after the prompt, given (teacher-forced)
        prompt = torch.randint(0, VOCAB, (1, PROMPT), generator=g).to(device)
        ids = torch.randint(0, VOCAB, (1, GENERATE), generator=g).to(device)
        return Inputs(ids, torch.arange(PROMPT, PROMPT + GENERATE, device=device), prompt)
    if case.phase == "decode":
        prompt = torch.randint(0, VOCAB, (1, PROMPT), generator=g).to(device)
        ids = torch.randint(0, VOCAB, (1, 1), generator=g).to(device)
        return Inputs(ids, torch.tensor([PROMPT], device=device), prompt)
    ids = torch.randint(0, VOCAB, (1, PROMPT_PREFILL), generator=g).to(device)
    return Inputs(ids, torch.arange(PROMPT_PREFILL, device=device), None)


def side_step(case: DecodeCase, model: torch.nn.Module, fn: Callable, x: Inputs, dtype: torch.dtype,
              device: torch.device) -> Callable[[], torch.Tensor]:
    """One side's call: ``fn`` (the model's forward, compiled or not) on the case's inputs. A
    decode step gets a cache of its own, filled with the prompt by the eager model, rewound to
    the prompt's length before each call; a generation loop a ``DynamicCache`` of its own, filled
    alike and cropped back to the prompt before each call, which then decodes its tokens one by
    one (the last step's logits are the call's result)."""
    if case.phase == "generate":
        return _generate_step(model, fn, x, device)
    if case.phase == "prefill":
        def prefill() -> torch.Tensor:
            with torch.no_grad():
                return fn(x.ids, x.positions, None)
        return prefill
    cache = static_cache(model, MAX_CACHE, dtype, device)
    eager = forward_fn(model)
    with torch.no_grad():
        eager(x.prompt, torch.arange(PROMPT, device=device), cache)

    def decode() -> torch.Tensor:
        rewind(cache, PROMPT)
        with torch.no_grad():
            return fn(x.ids, x.positions, cache)
    return decode


def _generate_step(model: torch.nn.Module, fn: Callable, x: Inputs, device: torch.device
                   ) -> Callable[[], torch.Tensor]:
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad():
        forward_fn(model)(x.prompt, torch.arange(PROMPT, device=device), cache)

    def generate() -> torch.Tensor:
        extra = cache.get_seq_length() - PROMPT
        if extra > 0:  # a negative count removes that many positions in transformers 4 and 5 alike
            cache.crop(-extra)
        with torch.no_grad():
            for i in range(x.ids.shape[1]):
                logits = fn(x.ids[:, i:i + 1], x.positions[i:i + 1], cache)
        return logits
    return generate
