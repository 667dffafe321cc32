"""ModelOpt NVFP4 checkpoints (``tilewright.quant.modelopt``).

The slow tests make a real checkpoint with NVIDIA ModelOpt's own quantiser on the CPU (a tiny
random Llama, ``mtq.quantize(model, NVFP4_DEFAULT_CFG, forward_loop=None)`` and
``export_hf_checkpoint``), load it with ``load_modelopt_checkpoint`` and compare against
ModelOpt's ``NVFP4QTensor.dequantize``; they are slow because importing modelopt takes ~10-30 s.
The fast ones write the same layout by hand (our quantiser) to check the loader's refusals.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn as nn

from tilewright.errors import InvalidInputError
from tilewright.quant import modelopt as mo
from tilewright.quant import nvfp4
from tilewright.quant.linear import NVFP4Linear


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def tiny_llama_config():
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    cfg.architectures = ["LlamaForCausalLM"]  # export_hf_checkpoint needs it
    return cfg


@pytest.fixture(scope="module")
def modelopt_export(tmp_path_factory):
    """(checkpoint folder, the float model before quantisation) made by ModelOpt itself; a second
    checkpoint with the MLPs excluded from quantisation."""
    mtq = pytest.importorskip("modelopt.torch.quantization")
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import LlamaForCausalLM

    out = {}
    for variant in ("default", "mlp_excluded"):
        torch.manual_seed(0)
        model = LlamaForCausalLM(tiny_llama_config()).eval()
        float_model = copy.deepcopy(model)
        cfg = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG)
        if variant == "mlp_excluded":
            # ModelOpt 0.47's quant_cfg is a list of rules, later ones winning
            rule = {"quantizer_name": "*mlp*", "enable": False}
            if isinstance(cfg["quant_cfg"], dict):
                cfg["quant_cfg"]["*mlp*"] = {"enable": False}
            else:
                cfg["quant_cfg"].append(rule)
        mtq.quantize(model, cfg, forward_loop=None)  # weight-only calibration runs on a CPU
        folder = tmp_path_factory.mktemp(f"modelopt_{variant}")
        export_hf_checkpoint(model, export_dir=str(folder))
        out[variant] = (folder, float_model)
    return out


@pytest.mark.slow
def test_modelopt_checkpoint_dequantises_to_modelopts_bits(modelopt_export):
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    folder, _ = modelopt_export["default"]
    tensors = mo.read_tensors(folder)
    model = mo.load_modelopt_checkpoint(folder)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, NVFP4Linear)}
    assert len(layers) == 2 * 7  # q, k, v, o, gate, up, down per layer
    assert isinstance(model.lm_head, nn.Linear) and not isinstance(model.lm_head, NVFP4Linear)
    for name, layer in layers.items():
        # loaded as stored: no re-quantising
        assert torch.equal(layer.weight, tensors[f"{name}.weight"])
        assert torch.equal(layer.weight_scale.view(torch.uint8), tensors[f"{name}.weight_scale"].view(torch.uint8))
        theirs = NVFP4QTensor(torch.Size((layer.out_features, layer.in_features)), torch.float32,
                              tensors[f"{name}.weight"]).dequantize(
            dtype=torch.float32, scale=tensors[f"{name}.weight_scale"],
            double_scale=tensors[f"{name}.weight_scale_2"], block_sizes={-1: 16})
        ours = layer.dequantized_weight()
        assert torch.equal(ours, theirs), name


@pytest.mark.slow
def test_modelopt_checkpoint_outputs_match_dequantised_reference(modelopt_export):
    """The loaded W4A4 model against the float model carrying ModelOpt's dequantised weights
    (activations unquantised): the gap is the activations' NVFP4 rounding; a weight loaded in
    the wrong order or with the wrong scale would be ~1."""
    folder, float_model = modelopt_export["default"]
    model = mo.load_modelopt_checkpoint(folder)
    reference = copy.deepcopy(float_model)
    tensors = mo.read_tensors(folder)
    for name, mod in reference.named_modules():
        if isinstance(mod, nn.Linear) and f"{name}.weight_scale" in tensors:
            mod.weight.data = mo.dequantize(tensors[f"{name}.weight"], tensors[f"{name}.weight_scale"],
                                            tensors[f"{name}.weight_scale_2"])
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = model(ids).logits
        ref = reference(ids).logits
        unquantised = float_model(ids).logits
    err = rel_err(out, ref)
    assert err < 0.1, err
    # and the reference is the quantised model, not the float one it came from
    assert rel_err(ref, unquantised) > 1e-3


@pytest.mark.slow
def test_modelopt_checkpoint_honours_excluded_modules(modelopt_export):
    folder, _ = modelopt_export["mlp_excluded"]
    section = mo.read_quant_config(folder)
    assert any("mlp" in p for p in section["exclude_modules"])
    model = mo.load_modelopt_checkpoint(folder)
    kinds = {n: type(m).__name__ for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert all(k == "Linear" for n, k in kinds.items() if ".mlp." in n or n == "lm_head")
    assert all(k == "NVFP4Linear" for n, k in kinds.items() if ".self_attn." in n)


# -- the loader's refusals, on checkpoints written by hand in ModelOpt's layout ----------------------
def write_checkpoint(folder, model: nn.Module, *, algo="NVFP4", exclude=("lm_head",), extra=None):
    from safetensors.torch import save_file

    tensors = {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and name not in exclude:
            q = nvfp4.quantize(mod.weight.detach())
            tensors |= {f"{name}.weight": q.data, f"{name}.weight_scale": q.scale,
                        f"{name}.weight_scale_2": q.global_scale.reshape(())}
            if mod.bias is not None:
                tensors[f"{name}.bias"] = mod.bias.detach()
    for k, v in model.state_dict().items():
        tensors.setdefault(k, v)
    tensors |= extra or {}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "hf_quant_config.json").write_text(json.dumps(
        {"quantization": {"quant_algo": algo, "group_size": 16, "exclude_modules": list(exclude)}}))
    return tensors


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(32, 48)
        self.down = nn.Linear(48, 32, bias=False)
        self.lm_head = nn.Linear(32, 16)

    def forward(self, x):
        return self.lm_head(self.down(torch.relu(self.up(x))))


def test_modelopt_loader_copies_tensors_and_keeps_excluded_float(tmp_path):
    torch.manual_seed(0)
    src = Mlp()
    tensors = write_checkpoint(tmp_path, src)
    model = mo.apply_checkpoint(Mlp(), tmp_path)
    assert isinstance(model.up, NVFP4Linear) and isinstance(model.down, NVFP4Linear)
    assert type(model.lm_head) is nn.Linear and torch.equal(model.lm_head.weight, src.lm_head.weight)
    assert torch.equal(model.up.weight, tensors["up.weight"]) and torch.equal(model.up.bias, src.up.bias)
    assert model.down.bias is None
    w = model.up.dequantized_weight()
    assert rel_err(w, src.up.weight) < 0.15
    x = torch.randn(5, 32)
    with torch.no_grad():
        assert rel_err(model(x), src(x)) < 0.2


def test_modelopt_loader_takes_input_scale_as_static_activation_scale(tmp_path):
    src = Mlp()
    write_checkpoint(tmp_path, src, extra={"up.input_scale": torch.tensor(0.004)})
    model = mo.apply_checkpoint(Mlp(), tmp_path)
    assert model.up.input_global_scale.item() == pytest.approx(0.004)
    assert model.down.input_global_scale is None


@pytest.mark.parametrize("algo", ["FP8", "W4A8_AWQ", None])
def test_modelopt_loader_refuses_other_algorithms(tmp_path, algo):
    write_checkpoint(tmp_path, Mlp(), algo=algo)
    with pytest.raises(InvalidInputError, match="NVFP4"):
        mo.apply_checkpoint(Mlp(), tmp_path)


def test_modelopt_loader_refuses_awq_pre_quant_scale(tmp_path):
    write_checkpoint(tmp_path, Mlp(), extra={"up.pre_quant_scale": torch.ones(32)})
    with pytest.raises(InvalidInputError, match="pre-quantisation"):
        mo.apply_checkpoint(Mlp(), tmp_path)


def test_modelopt_loader_refuses_scales_on_an_excluded_module(tmp_path):
    write_checkpoint(tmp_path, Mlp(), exclude=())
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(
        {"quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_*"]}}))
    with pytest.raises(InvalidInputError, match="exclude_modules"):
        mo.apply_checkpoint(Mlp(), tmp_path)


def test_modelopt_loader_refuses_a_wrongly_shaped_scale(tmp_path):
    tensors = write_checkpoint(tmp_path, Mlp())
    from safetensors.torch import save_file

    tensors["up.weight_scale"] = tensors["up.weight_scale"][:, :1].contiguous()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(InvalidInputError, match="up.weight_scale"):
        mo.apply_checkpoint(Mlp(), tmp_path)


def test_modelopt_loader_refuses_a_folder_without_modelopt_config(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(InvalidInputError, match="not a ModelOpt checkpoint"):
        mo.read_quant_config(tmp_path)


def test_modelopt_loader_says_a_missing_path_does_not_exist(tmp_path):
    with pytest.raises(InvalidInputError, match="does not exist"):
        mo.load_modelopt_checkpoint(tmp_path / "no-such-export")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(InvalidInputError, match="is a file"):
        mo.read_quant_config(tmp_path / "model.safetensors")


def test_modelopt_loader_names_a_truncated_shard(tmp_path):
    write_checkpoint(tmp_path, Mlp())
    shard = tmp_path / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(InvalidInputError, match=r"model\.safetensors .*truncated or corrupt"):
        mo.apply_checkpoint(Mlp(), tmp_path)


def test_modelopt_exclusion_patterns():
    assert mo.excluded("lm_head", ["lm_head"])
    assert mo.excluded("model.layers.3.mlp.gate", ["model.layers.*.mlp.gate"])
    assert mo.excluded("model.layers.0.mlp.up_proj", ["model.layers.0.mlp"])
    assert not mo.excluded("model.layers.10.mlp.up_proj", ["model.layers.1"])
    assert not mo.excluded("model.layers.0.self_attn.q_proj", ["*mlp*"])
