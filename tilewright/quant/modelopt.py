"""Load NVIDIA ModelOpt NVFP4 checkpoints (Hugging Face layout) into :class:`NVFP4Linear` layers.

A checkpoint written by ModelOpt's ``export_hf_checkpoint`` after ``mtq.quantize(model,
NVFP4_DEFAULT_CFG, ...)`` is a Hugging Face model folder whose ``hf_quant_config.json`` says
``"quant_algo": "NVFP4"`` (``"group_size": 16``, ``"exclude_modules"``: names or shell patterns
left in their float dtype) and whose safetensors hold, per quantised linear ``<name>``:

* ``<name>.weight``: uint8 (out, in/2), two E2M1 codes per byte, the even index in the low nibble;
* ``<name>.weight_scale``: float8_e4m3fn (out, in/16), one scale per 16 values (row-major);
* ``<name>.weight_scale_2``: float32 scalar, the per-tensor decode scale (``amax / (6 * 448)``);
* ``<name>.input_scale``: float32 scalar, the activation's decode scale, when activations were
  calibrated (absent after weight-only calibration; then each call quantises its activation with
  its own amax);
* ``<name>.bias`` as the float model had it.

This is exactly tilewright's NVFP4 layout (:mod:`tilewright.quant.nvfp4`), so the tensors are
copied into the layers as they are, never re-quantised: ``weight_scale_2`` becomes
``weight_global_scale`` and ``input_scale`` ``input_global_scale``. Dequantising follows
ModelOpt's ``NVFP4QTensor.dequantize``: ``e2m1 * (float(weight_scale) * weight_scale_2)``
(``tests/test_modelopt.py`` proves equality against the installed ``nvidia-modelopt``).

Format source: ModelOpt 0.47 (``modelopt/torch/export/unified_export_hf.py``,
``modelopt/torch/quantization/qtensor/nvfp4_tensor.py``), read on the exported files.
"""

from __future__ import annotations

import fnmatch
import json
import logging
from pathlib import Path
from typing import Any, Iterable

import torch
import torch.nn as nn

from tilewright.errors import InvalidInputError
from tilewright.quant import nvfp4
from tilewright.quant.linear import NVFP4Linear

log = logging.getLogger("tilewright.quant")

QUANT_SUFFIXES = ("weight_scale", "weight_scale_2", "input_scale")
# tensors ModelOpt writes for recipes this loader does not run; refused by name
UNSUPPORTED_SUFFIXES = {"pre_quant_scale": "AWQ's pre-quantisation scale (NVFP4_AWQ)",
                        "weight_zero_point": "integer zero points"}


def read_quant_config(path: str | Path) -> dict[str, Any]:
    """The ``quantization`` section of a ModelOpt checkpoint: ``hf_quant_config.json``, or
    ``config.json``'s ``quantization_config`` (``quant_method: modelopt``) when the former is
    missing.

    Raises:
        InvalidInputError: ``path`` does not exist or is no folder; no ModelOpt quantisation
            config, or one that is not NVFP4.
    """
    folder = Path(path)
    if not folder.exists():
        raise InvalidInputError(f"{folder} does not exist: pass the folder a ModelOpt export wrote "
                                "(modelopt.torch.export.export_hf_checkpoint(model, export_dir=...))")
    if not folder.is_dir():
        raise InvalidInputError(f"{folder} is a file; a ModelOpt checkpoint is a folder (config.json, "
                                "hf_quant_config.json and the .safetensors files): pass the folder")
    hf_quant = folder / "hf_quant_config.json"
    if hf_quant.is_file():
        section = json.loads(hf_quant.read_text()).get("quantization", {})
    else:
        cfg = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
        q = cfg.get("quantization_config") or {}
        if q.get("quant_method") != "modelopt":
            raise InvalidInputError(
                f"{folder} is not a ModelOpt checkpoint: no hf_quant_config.json and no "
                "quantization_config with quant_method 'modelopt' in config.json (export it with "
                "modelopt.torch.export.export_hf_checkpoint)")
        section = {"quant_algo": q.get("quant_algo"), "exclude_modules": q.get("ignore", []),
                   "group_size": 16}
    algo = section.get("quant_algo")
    if algo != "NVFP4":
        raise InvalidInputError(
            f"{folder}: quant_algo is {algo!r}; tilewright loads ModelOpt NVFP4 checkpoints only "
            "(quantise with NVFP4_DEFAULT_CFG)")
    if int(section.get("group_size") or 16) != nvfp4.BLOCK:
        raise InvalidInputError(f"{folder}: group_size {section.get('group_size')}; NVFP4 blocks are "
                                f"{nvfp4.BLOCK} values")
    if section.get("kv_cache_quant_algo"):
        log.warning("%s: kv_cache_quant_algo %s is not applied (the KV cache stays in the model's dtype)",
                    folder, section["kv_cache_quant_algo"])
    return section


def excluded(name: str, patterns: Iterable[str]) -> bool:
    """Whether module ``name`` matches an ``exclude_modules`` entry (a name or a shell pattern
    such as ``model.layers.*.mlp.gate``; a pattern also covers the modules under it)."""
    for p in patterns:
        if fnmatch.fnmatchcase(name, p):
            return True
        if not any(c in p for c in "*?[") and name.startswith(p + "."):
            return True
    return False


def read_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's safetensors files (one file or an indexed set of shards).

    Raises:
        InvalidInputError: no safetensors file in the folder; a shard that is missing, or
            truncated or corrupt (safetensors cannot parse it): the message names the file.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(path)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise InvalidInputError(f"{folder} holds no .safetensors file")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        shard = folder / f
        if not shard.is_file():
            raise InvalidInputError(f"{shard} is missing: the checkpoint's index names it (copy the whole folder)")
        try:
            out.update(load_file(str(shard)))
        except (SafetensorError, OSError, ValueError) as e:
            size = shard.stat().st_size
            raise InvalidInputError(f"{shard} ({size} bytes) is truncated or corrupt: safetensors cannot read "
                                    f"it ({type(e).__name__}: {e}); copy or export it again") from e
    return out


def dequantize(weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A ModelOpt NVFP4 weight as floats, (out, in): ``e2m1 * (weight_scale * weight_scale_2)``
    in float32, the order ModelOpt's ``NVFP4QTensor.dequantize`` rounds in, then ``dtype``."""
    return nvfp4.dequantize(nvfp4.NVFP4Tensor(weight, weight_scale, weight_scale_2.float().reshape(())), dtype)


def nvfp4_linear(name: str, tensors: dict[str, torch.Tensor], linear: nn.Linear,
                 dtype: torch.dtype) -> NVFP4Linear:
    """The :class:`NVFP4Linear` for ModelOpt linear ``name`` (the float ``linear`` it replaces
    gives the sizes and whether there is a bias), its tensors copied as stored.

    Raises:
        InvalidInputError: a tensor missing or of the wrong dtype or shape.
    """
    N, K = linear.out_features, linear.in_features
    if K % nvfp4.BLOCK:
        raise InvalidInputError(f"{name}: in_features {K} is not a multiple of {nvfp4.BLOCK}; ModelOpt padded "
                                "it, which NVFP4Linear does not take")
    want = {"weight": (torch.uint8, (N, K // 2)),
            "weight_scale": (torch.float8_e4m3fn, (N, K // nvfp4.BLOCK)),
            "weight_scale_2": (torch.float32, ())}
    got = {}
    for suffix, (dt, shape) in want.items():
        t = tensors.get(f"{name}.{suffix}")
        if t is None:
            raise InvalidInputError(f"{name}.{suffix} is missing from the checkpoint")
        if t.dtype != dt or tuple(t.shape) not in (shape, (1,) if shape == () else shape):
            raise InvalidInputError(f"{name}.{suffix} is {t.dtype} {tuple(t.shape)}; an NVFP4 linear "
                                    f"({N}x{K}) needs {dt} {shape}")
        got[suffix] = t.reshape(shape)
    bias = tensors.get(f"{name}.bias")
    m = NVFP4Linear(K, N, bias=bias is not None, dtype=dtype, device=linear.weight.device)
    m.weight.copy_(got["weight"])
    m.weight_scale.copy_(got["weight_scale"])
    m.weight_global_scale.copy_(got["weight_scale_2"])
    if (inp := tensors.get(f"{name}.input_scale")) is not None:
        m.input_global_scale = inp.float().reshape(()).to(linear.weight.device)
    if bias is not None:
        m.bias.copy_(bias)
    return m


def apply_checkpoint(model: nn.Module, path: str | Path, *, dtype: torch.dtype | None = None) -> nn.Module:
    """Replace ``model``'s quantised linears by :class:`NVFP4Linear` layers holding the
    checkpoint's tensors and load every other tensor into ``model`` (in place; returned).

    ``model`` is the float architecture the checkpoint was exported from (any ``nn.Module``
    whose parameter names match the checkpoint's). A linear is loaded as NVFP4 when the
    checkpoint has its ``weight_scale``; one that ``exclude_modules`` names keeps its float
    weight.

    Raises:
        InvalidInputError: not a ModelOpt NVFP4 checkpoint; an excluded module that carries
            NVFP4 scales; a tensor the model has no place for, or a parameter the checkpoint
            lacks; a recipe this loader does not run (AWQ pre-quantisation scales).
    """
    section = read_quant_config(path)
    patterns = list(section.get("exclude_modules") or [])
    tensors = read_tensors(path)
    for key in tensors:
        suffix = key.rsplit(".", 1)[-1]
        if suffix in UNSUPPORTED_SUFFIXES:
            raise InvalidInputError(f"{key}: {UNSUPPORTED_SUFFIXES[suffix]} is not supported; export "
                                    "with NVFP4_DEFAULT_CFG")
    used: set[str] = set()
    count = 0
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if not isinstance(child, nn.Linear) or f"{name}.weight_scale" not in tensors:
                continue
            if excluded(name, patterns):
                raise InvalidInputError(f"{name} is in exclude_modules but carries NVFP4 scales: the "
                                        "checkpoint contradicts its hf_quant_config.json")
            layer_dtype = dtype or child.weight.dtype
            setattr(parent, child_name, nvfp4_linear(name, tensors, child, layer_dtype))
            used |= {f"{name}.{s}" for s in ("weight", "bias", *QUANT_SUFFIXES)}
            count += 1
    if count == 0:
        raise InvalidInputError(f"{path}: no linear of the model has NVFP4 tensors in the checkpoint "
                                "(is it the architecture the checkpoint was exported from?)")
    rest = {k: v for k, v in tensors.items() if k not in used}
    missing, unexpected = model.load_state_dict(rest, strict=False)
    nvfp4_buffers = {"weight", "weight_scale", "weight_global_scale", "input_global_scale", "bias"}
    missing = [k for k in missing if not (isinstance(_module_of(model, k), NVFP4Linear)
                                          and k.rsplit(".", 1)[-1] in nvfp4_buffers)]
    tied = _tied_names(model)
    missing = [k for k in missing if k not in tied]
    if unexpected or missing:
        raise InvalidInputError(f"{path} does not match the model: checkpoint tensors without a place "
                                f"{sorted(unexpected)[:5]}, model tensors without a value {sorted(missing)[:5]}")
    if dtype is not None:
        for m in model.modules():
            if not isinstance(m, NVFP4Linear):
                for p in m.parameters(recurse=False):
                    p.data = p.data.to(dtype) if p.is_floating_point() else p.data
    log.info("loaded %d NVFP4 linears from %s (excluded: %s)", count, path, patterns)
    return model


def _module_of(model: nn.Module, key: str) -> nn.Module | None:
    try:
        return model.get_submodule(key.rsplit(".", 1)[0]) if "." in key else model
    except AttributeError:
        return None


def _tied_names(model: nn.Module) -> set[str]:
    """Parameter names that share storage with an earlier one (tied embeddings)."""
    seen: dict[int, str] = {}
    tied = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.add(name)
        else:
            seen[id(p)] = name
    return tied


def load_modelopt_checkpoint(path: str | Path, *, dtype: torch.dtype | None = None,
                             device: str | torch.device = "cpu") -> nn.Module:
    """Load a Hugging Face checkpoint exported by NVIDIA ModelOpt with ``quant_algo: NVFP4`` as a
    ``transformers`` model whose quantised linears are :class:`NVFP4Linear` (no re-quantising:
    the packed E2M1 weights, E4M3 block scales and fp32 global scales are copied as stored);
    modules in ``exclude_modules`` (the embeddings and ``lm_head`` by default) stay float.
    The model is in eval mode, ready for ``torch.compile(model, backend="tilewright")``.

    Args:
        path: the checkpoint folder (``config.json``, ``hf_quant_config.json``, safetensors).
        dtype: dtype of the float parts and of the linears' activations (default: the
            checkpoint's ``dtype``/``torch_dtype``, else float32).
        device: where the model is built.

    Raises:
        InvalidInputError: see :func:`apply_checkpoint`; also an architecture that transformers
            does not know.
    """
    import transformers

    folder = Path(path)
    read_quant_config(folder)  # refuse non-NVFP4 folders before building anything
    config = transformers.AutoConfig.from_pretrained(str(folder))
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the layers are ours: transformers must not quantise
    if dtype is None:
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    arch = (getattr(config, "architectures", None) or [None])[0]
    cls = getattr(transformers, arch, None) if arch else None
    if cls is None:
        raise InvalidInputError(f"{folder}: config.json names architecture {arch!r}, which transformers "
                                f"{transformers.__version__} does not have")
    with torch.device(device):
        model = cls._from_config(config, dtype=dtype)
    apply_checkpoint(model, folder, dtype=dtype)
    return model.eval()
