"""DistributedSync over gloo: a rollout worker in a spawned process follows the trainer's LoRA weights."""

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from sync_fake_receiver import BufferEngine, PeftEngine, tiny_llama, token_logprobs  # noqa: E402

from rl.sync.adapter import add_lora, lora_tensors  # noqa: E402
from rl.sync.transport import DistributedSync, tensor_specs  # noqa: E402

TARGETS = ["q_proj", "v_proj", "up_proj"]
# per layer: q, v and up, each A [4, 64] and B [out, 4], with out = 64, 32, 112; fp32; 2 layers
ADAPTER_BYTES = 2 * 4 * 4 * ((64 + 64) + (64 + 32) + (64 + 112))


def randomize(named: dict[str, torch.Tensor], seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in named.values():
            tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.2)


@pytest.mark.timeout(90)
def test_worker_model_follows_several_pushes():
    """1000-byte buckets are smaller than every tensor (the smallest has 1024 bytes): tensors span buckets."""
    trainer = add_lora(tiny_llama(), rank=4, alpha=8, target_modules=TARGETS)
    named = lora_tensors(trainer)
    input_ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    worker_args = (tiny_llama().state_dict(), 4, 8.0, TARGETS)
    with DistributedSync(PeftEngine, worker_args, bucket_bytes=1000, timeout_s=30) as sync:
        assert sync.backend == "gloo"
        for version in (1, 2, 7):
            randomize(named, seed=version)
            stats = sync.push(named, version)
            assert (stats.version, stats.bytes) == (version, ADAPTER_BYTES)
            assert stats.num_buckets == math.ceil(ADAPTER_BYTES / 1000)
            acked, weights = sync.call("weights")
            assert acked == version
            assert all(torch.equal(weights[name], named[name]) for name in named)
            acked, logprobs = sync.call(input_ids)
            torch.testing.assert_close(logprobs, token_logprobs(trainer, input_ids), rtol=0, atol=1e-6)


@pytest.mark.timeout(60)
def test_default_buckets_and_a_bad_update_rejected_before_sending():
    """Mixed dtypes and odd sizes: the bytes of a bf16 [7, 3] tensor follow a fp32 [4, 8] one."""
    named = {"layer.lora_A": torch.randn(4, 8), "layer.lora_B": torch.randn(7, 3).bfloat16()}
    with DistributedSync(BufferEngine, (tensor_specs(named),), timeout_s=30) as sync:
        assert sync.push(named, 1).num_buckets == 1
        bad = {**named, "layer.lora_B": torch.randn(7, 3)}
        with pytest.raises(ValueError, match="is torch.float32 but the receiver's buffer is torch.bfloat16"):
            sync.push(bad, 2)
        version, weights = sync.call("weights")
        assert version == 1 and all(torch.equal(weights[n], named[n]) for n in named)
        randomize(named, seed=5)
        sync.push(named, 2)
        version, weights = sync.call("weights")
        assert version == 2 and all(torch.equal(weights[n], named[n]) for n in named)


@pytest.mark.timeout(60)
def test_factory_error_reaches_the_trainer():
    with pytest.raises(RuntimeError, match="no model file at /nonexistent/model.gguf"):
        DistributedSync("sync_fake_receiver:build_failing_engine", timeout_s=10)


@pytest.mark.timeout(60)
def test_worker_that_never_starts_is_stopped():
    with pytest.raises(TimeoutError, match="sent no 'ready' in 3 s; it was stopped"):
        DistributedSync("sync_fake_receiver.build_stuck_engine", startup_timeout_s=3)


@pytest.mark.timeout(60)
def test_dead_worker_gives_an_error_not_a_hang():
    named = {"layer.lora_A": torch.randn(4, 8)}
    with DistributedSync(BufferEngine, (tensor_specs(named),), timeout_s=10) as sync:
        sync.push(named, 1)
        with pytest.raises(RuntimeError, match="died \\(exit code 3\\) before sending 'ack'"):
            sync.push(named, 13)
        with pytest.raises(RuntimeError, match="not running \\(exit code 3\\)"):
            sync.push(named, 2)
