"""GEMM problems from a shapes file (the format of ``bench/cases/llm_gemm_shapes.json``).

The file lists token counts and, per model, its linear layers as ``{"N": out_features,
"K": in_features}``; ``y = x @ W^T`` gives M = tokens, B a transposed weight (``layout_b="col"``)::

    {"m_decode": [1, 2, ...], "m_prefill": [512, ...],
     "models": {"llama-3-8b": {"qkv_proj": {"N": 6144, "K": 4096}, ...}, ...}}

A layer marked ``"grouped": true`` with ``experts`` and ``top_k`` is a mixture-of-experts
projection. Until a grouped-GEMM template exists it is tuned as the batched GEMM a uniform router
gives: with T tokens, ``min(experts, T x top_k)`` experts are active, each with
``ceil(T x top_k / active)`` rows.

It moved here from :mod:`tilewright.autotune.shapes`, which keeps :class:`NamedProblem` (a
problem of any kind with a readable id) and resolves this module's names for one release, with
a DeprecationWarning.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable

from tilewright.autotune.buckets import bucket
from tilewright.autotune.shapes import NamedProblem
from tilewright.errors import TilewrightError
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import GEMM_INPUT_DTYPES, EpilogueInput, EpilogueOp

PHASES = ("decode", "prefill")


class ShapesFileError(TilewrightError):
    """A shapes file that cannot be read or does not follow the format; says what to fix."""


def load_shapes(path: Path | str) -> dict[str, Any]:
    """Read and validate a shapes file.

    Raises:
        ShapesFileError: missing file, bad JSON, or a model/layer without int N and K.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ShapesFileError(f"no shapes file at {path}; give a JSON file like "
                              f"bench/cases/llm_gemm_shapes.json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ShapesFileError(f"{path} is not JSON ({e}); fix it or regenerate it") from None
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict) or not data["models"]:
        raise ShapesFileError(f"{path} has no \"models\" object; see bench/cases/llm_gemm_shapes.json")
    for phase in PHASES:
        ms = data.get(f"m_{phase}", [])
        if not isinstance(ms, list) or not all(isinstance(m, int) and m > 0 for m in ms):
            raise ShapesFileError(f"{path}: \"m_{phase}\" must be a list of positive ints")
    for model, layers in data["models"].items():
        if not isinstance(layers, dict):
            raise ShapesFileError(f"{path}: model {model!r} must map layer names to {{N, K}}")
        for layer, nk in layers.items():
            if not (isinstance(nk, dict) and isinstance(nk.get("N"), int) and isinstance(nk.get("K"), int)):
                raise ShapesFileError(f"{path}: {model}.{layer} needs integer \"N\" and \"K\"")
    return data


def _layer_problem(M: int, nk: dict[str, Any], dtype: str, dynamic: frozenset[str],
                   bias: bool = False) -> GemmProblem:
    if nk.get("grouped"):
        experts, top_k = int(nk.get("experts", 1)), int(nk.get("top_k", 1))
        active = max(1, min(experts, M * top_k))
        rows = math.ceil(M * top_k / active)
        return GemmProblem(M=rows, N=nk["N"], K=nk["K"], batch=active, batched=True, dtype=dtype,
                           layout_b="col", op="bmm", dynamic=dynamic)
    if bias:  # what nn.Linear(bias=True) lowers to: addmm with the bias as a fused add
        return GemmProblem(M=M, N=nk["N"], K=nk["K"], dtype=dtype, layout_b="col", op="addmm",
                           dynamic=dynamic, epilogue=(EpilogueOp("add", input=0),),
                           epilogue_inputs=(EpilogueInput("N", dtype),))
    return GemmProblem(M=M, N=nk["N"], K=nk["K"], dtype=dtype, layout_b="col", op="mm",
                       dynamic=dynamic)


def problems_from_shapes(data: dict[str, Any], *, models: Iterable[str] | None = None,
                         phases: Iterable[str] = PHASES, m_values: Iterable[int] | None = None,
                         dtype: str = "bf16", dynamic: Iterable[str] = (),
                         bias: bool = False) -> list[NamedProblem]:
    """Every (model, layer, M) problem of a loaded shapes file, in file order.

    Args:
        models: model names to keep (default all).
        phases: "decode" and/or "prefill" (which M lists to use).
        m_values: explicit M values instead of the file's lists.
        dtype: input/output dtype ("bf16", "fp16", "fp32").
        dynamic: dims to mark dynamic ("M"), so the keys match a model compiled with dynamic
            shapes; M is then rounded to its bucket.
        bias: the layers have a bias (``nn.Linear(bias=True)`` lowers to addmm + a fused add,
            a different problem from the bias-free mm).

    Raises:
        ShapesFileError: an unknown model, phase or dtype.
    """
    if dtype not in GEMM_INPUT_DTYPES:
        raise ShapesFileError(f"dtype {dtype!r}: choose one of {', '.join(GEMM_INPUT_DTYPES)}")
    wanted = list(models) if models is not None else list(data["models"])
    unknown = [m for m in wanted if m not in data["models"]]
    if unknown:
        raise ShapesFileError(f"unknown model(s) {unknown}; the file has {', '.join(data['models'])}")
    phases = list(phases)
    bad = [p for p in phases if p not in PHASES]
    if bad:
        raise ShapesFileError(f"unknown phase(s) {bad}; choose from {', '.join(PHASES)}")
    if m_values is not None:
        ms = list(m_values)
    else:
        ms = [m for p in phases for m in data.get(f"m_{p}", [])]
    dyn = frozenset(dynamic)
    if "M" in dyn:
        ms = list(dict.fromkeys(bucket(m) for m in ms))
    out = []
    for model in wanted:
        for layer, nk in data["models"][model].items():
            short = layer.split(" ")[0]
            for M in ms:
                out.append(NamedProblem(f"{model}.{short}.M{M}", _layer_problem(M, nk, dtype, dyn, bias)))
    return out
