"""rl.sync.adapter: target resolution, the engine naming contract and the LoRA math it implies."""

import math

import pytest
import torch

from rl.sync.adapter import add_lora, lora_tensors, resolve_target_modules
from tests.helpers.sync_fake_receiver import tiny_llama

HIDDEN, INTERMEDIATE, KV_OUT = 64, 112, 2 * 16  # tiny_llama: 4 heads of 16, 2 KV heads


def test_target_shorthands_and_lists():
    assert resolve_target_modules("all") == [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
    ]  # fmt: skip
    assert resolve_target_modules("all-linear") == resolve_target_modules("all")
    assert resolve_target_modules("attention") == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert resolve_target_modules("mlp") == ["gate_proj", "up_proj", "down_proj"]
    assert resolve_target_modules(["down_proj", "q_proj"]) == ["q_proj", "down_proj"]


def test_target_names_may_be_comma_separated():
    # lora.target_modules is a string in the config: lora.target_modules='v_proj, q_proj'
    assert resolve_target_modules("v_proj, q_proj") == ["q_proj", "v_proj"]
    with pytest.raises(ValueError, match="unknown: \\['lm_head'\\]"):
        resolve_target_modules("q_proj,lm_head")


@pytest.mark.parametrize(
    ("targets", "message"),
    [("everything", "Unknown LoRA target shorthand"), (["q_proj", "lm_head"], "unknown: \\['lm_head'\\]"),
     ([], "non-empty"), (["q_proj", "q_proj"], "twice")],
)  # fmt: skip
def test_bad_targets_are_rejected(targets, message):
    with pytest.raises(ValueError, match=message):
        resolve_target_modules(targets)


def test_names_and_shapes_follow_the_contract():
    model = add_lora(tiny_llama(), rank=4, alpha=8, target_modules=["q_proj", "k_proj", "down_proj"])
    expected = {}
    for i in range(2):
        expected[f"model.layers.{i}.self_attn.q_proj.lora_A"] = (4, HIDDEN)
        expected[f"model.layers.{i}.self_attn.q_proj.lora_B"] = (HIDDEN, 4)
        expected[f"model.layers.{i}.self_attn.k_proj.lora_A"] = (4, HIDDEN)
        expected[f"model.layers.{i}.self_attn.k_proj.lora_B"] = (KV_OUT, 4)
        expected[f"model.layers.{i}.mlp.down_proj.lora_A"] = (4, INTERMEDIATE)
        expected[f"model.layers.{i}.mlp.down_proj.lora_B"] = (HIDDEN, 4)
    named = lora_tensors(model)
    assert {name: tuple(t.shape) for name, t in named.items()} == expected
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert len(trainable) == len(expected) and all(".lora_" in name for name in trainable)


def test_export_shares_storage_with_the_parameters():
    model = add_lora(tiny_llama(), rank=4, alpha=8, target_modules="attention")
    named = lora_tensors(model)
    param = model.get_base_model().model.layers[1].self_attn.v_proj.lora_B["default"].weight
    exported = named["model.layers.1.self_attn.v_proj.lora_B"]
    assert exported.data_ptr() == param.data_ptr() and not exported.requires_grad
    with torch.no_grad():
        param.add_(1.5)
    assert torch.equal(exported, param.detach())


@pytest.mark.parametrize("use_rslora", [False, True])
def test_exported_tensors_reproduce_peft_layers(use_rslora):
    """y = W x + scale * B (A x) with the exported A, B and scale alpha / r (alpha / sqrt(r) with
    rank-stabilised LoRA) equals peft's own layer output."""
    model = add_lora(tiny_llama(), rank=8, alpha=24, target_modules="all", use_rslora=use_rslora)
    scale = 24 / math.sqrt(8) if use_rslora else 24 / 8
    torch.manual_seed(1)
    named = lora_tensors(model)
    with torch.no_grad():
        for tensor in named.values():
            tensor.copy_(torch.randn_like(tensor) * 0.1)
    paths = [name.removesuffix(".lora_A") for name in named if name.endswith(".lora_A")]
    assert len(paths) == 14
    base = model.get_base_model()
    for path in paths:
        layer = base.get_submodule(path)
        x = torch.randn(3, layer.in_features)
        weight = layer.base_layer.weight  # [out_features, in_features]
        by_hand = x @ weight.T + scale * (x @ named[f"{path}.lora_A"].T) @ named[f"{path}.lora_B"].T
        torch.testing.assert_close(layer(x), by_hand, rtol=1e-5, atol=1e-6)


def test_export_rejects_a_plain_model():
    with pytest.raises(TypeError, match="PeftModel"):
        lora_tensors(tiny_llama())
