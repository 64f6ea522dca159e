"""The fused LoRA forward of the trainer against peft's own forward and backward."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from rl.algo.lora_fused import LoraLinear, fused_lora

VOCAB = 97


def _grads(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("bias", [True, False])
def test_lora_linear_matches_the_unfused_maths_forward_and_backward(bias: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 12, generator=gen, requires_grad=True)
    weight = torch.randn(7, 12, generator=gen, requires_grad=True)  # a base that trains: dW is checked too
    b0 = torch.randn(7, generator=gen, requires_grad=True) if bias else None
    a = torch.randn(3, 12, generator=gen, requires_grad=True)
    b = torch.randn(7, 3, generator=gen, requires_grad=True)
    dy = torch.randn(2, 5, 7, generator=gen)
    leaves = [t for t in (x, weight, b0, a, b) if t is not None]

    expected = nn.functional.linear(x, weight, b0) + nn.functional.linear(nn.functional.linear(x, a), b) * 2.5
    expected_grads = torch.autograd.grad(expected, leaves, dy)
    got = LoraLinear.apply(x, weight, b0, a, b, 2.5)
    got_grads = torch.autograd.grad(got, leaves, dy)

    torch.testing.assert_close(got, expected)
    for g, e in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(g, e)


def test_fused_model_gives_peft_logits_and_lora_gradients(make_llama, make_lora) -> None:
    model = make_lora(make_llama(), perturb=True)
    ids = torch.randint(1, VOCAB, (3, 9), generator=torch.Generator().manual_seed(3))

    model(input_ids=ids).logits.square().mean().backward()
    expected_logits, expected = model(input_ids=ids).logits.detach(), _grads(model)
    model.zero_grad(set_to_none=True)
    with fused_lora(model):
        logits = model(input_ids=ids).logits
    logits.square().mean().backward()

    torch.testing.assert_close(logits.detach(), expected_logits)
    got = _grads(model)
    assert got.keys() == expected.keys() and any("lora_A" in n for n in got)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], msg=name)


def _patched(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if "forward" in vars(m)]


def test_only_plain_adapters_are_fused_and_the_block_restores_peft(make_llama) -> None:
    model = get_peft_model(make_llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with fused_lora(model):
        assert len(_patched(model)) == 4  # q and v of two layers
    assert _patched(model) == []
    with model.disable_adapter(), fused_lora(model):
        assert _patched(model) == []  # adapters off: peft's forward runs the base

    dropout = get_peft_model(make_llama(), LoraConfig(r=4, target_modules=["q_proj"], lora_dropout=0.1))
    dora = get_peft_model(make_llama(), LoraConfig(r=4, target_modules=["q_proj"], use_dora=True))
    for other in (dropout, dora):
        with fused_lora(other):
            assert _patched(other) == []
