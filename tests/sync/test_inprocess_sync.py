"""InProcessSync: exact copies into receiver-owned buffers; bad updates change nothing."""

import pytest
import torch

from rl.sync.adapter import add_lora, lora_tensors
from rl.sync.transport import InProcessSync
from rollout_engine.sync_contract import tensor_specs
from tests.helpers.sync_fake_receiver import BufferEngine, PeftEngine, tiny_llama, token_logprobs


def randomize(named: dict[str, torch.Tensor], seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in named.values():
            tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.2)


@pytest.fixture
def trainer():
    return add_lora(tiny_llama(), rank=4, alpha=8, target_modules=["q_proj", "v_proj", "up_proj"])


def test_push_copies_exactly_and_reports_bytes(trainer):
    named = lora_tensors(trainer)
    engine = BufferEngine(tensor_specs(named))
    sync = InProcessSync(engine)
    for version in (1, 2, 5):
        randomize(named, seed=version)
        stats = sync.push(named, version)
        assert engine.version == version
        for name, tensor in named.items():
            assert torch.equal(engine.buffers[name], tensor)
            assert engine.buffers[name].data_ptr() != tensor.data_ptr()
    # per layer: q, v and up, each A [4, 64] and B [out, 4], with out = 64, 32, 112; fp32; 2 layers
    assert stats.bytes == 2 * 4 * 4 * ((64 + 64) + (64 + 32) + (64 + 112))
    assert stats.num_tensors == 12 and stats.ms > 0
    assert stats.metrics() == {"sync/ms": stats.ms, "sync/bytes": float(stats.bytes)}


def test_receiver_model_follows_the_trainer(trainer):
    """A peft copy fed only through the sync gives the trainer's logprobs, push after push."""
    base_state = tiny_llama().state_dict()  # the trainer's base: same seed
    engine = PeftEngine(base_state, rank=4, alpha=8, targets=["q_proj", "v_proj", "up_proj"])
    sync = InProcessSync(engine)
    input_ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    for version in range(3):
        randomize(lora_tensors(trainer), seed=10 + version)
        expected = token_logprobs(trainer, input_ids)
        assert not torch.allclose(token_logprobs(engine.model, input_ids), expected, atol=1e-3)
        sync.push(lora_tensors(trainer), version)
        torch.testing.assert_close(token_logprobs(engine.model, input_ids), expected, rtol=0, atol=1e-6)


def bad_updates(named):
    name = "model.layers.1.self_attn.v_proj.lora_B"
    yield "not hold", {**named, "model.layers.9.self_attn.q_proj.lora_A": torch.zeros(4, 64)}
    yield "lacks 1 tensor", {k: v for k, v in named.items() if k != name}
    yield "has shape \\(32, 8\\)", {**named, name: torch.zeros(32, 8)}
    yield "is torch.float16", {**named, name: named[name].half()}


@pytest.mark.parametrize("case", range(4))
def test_bad_update_is_rejected_and_old_weights_stay(trainer, case):
    named = lora_tensors(trainer)
    engine = BufferEngine(tensor_specs(named))
    sync = InProcessSync(engine)
    randomize(named, seed=3)
    sync.push(named, 1)
    before = {name: t.clone() for name, t in engine.buffers.items()}
    randomize(named, seed=4)
    message, update = list(bad_updates(named))[case]
    with pytest.raises(ValueError, match=message):
        sync.push(update, 2)
    assert engine.version == 1
    assert all(torch.equal(engine.buffers[name], before[name]) for name in before)
    sync.push(named, 2)
    assert all(torch.equal(engine.buffers[name], named[name]) for name in named)


def test_version_must_increase(trainer):
    named = lora_tensors(trainer)
    sync = InProcessSync(BufferEngine(tensor_specs(named)))
    sync.push(named, 3)
    with pytest.raises(ValueError, match="above the last pushed version 3"):
        sync.push(named, 3)


@pytest.mark.gpu
def test_push_between_cuda_tensors_is_exact():
    names = [f"model.layers.{i}.mlp.up_proj.lora_{ab}" for i in range(3) for ab in "AB"]
    named = {name: torch.randn(16, 40, device="cuda").to(torch.bfloat16) for name in names}
    engine = BufferEngine(tensor_specs(named), device="cuda")
    stats = InProcessSync(engine).push(named, 1)
    assert stats.bytes == 6 * 16 * 40 * 2 and engine.version == 1
    assert all(torch.equal(engine.buffers[name], named[name]) for name in named)
