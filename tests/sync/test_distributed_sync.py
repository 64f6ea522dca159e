"""DistributedSync: a rollout worker in a spawned process follows the trainer's LoRA weights, over gloo; on
GPUs, over gloo when trainer and worker share one GPU (NCCL refuses that) and over NCCL between two GPUs."""

import math

import pytest
import torch

from rl.job.rollout_worker import DistributedSync
from rl.sync.adapter import add_lora, lora_tensors
from rl.sync.transport import choose_backend, device_id
from rollout_engine.sync_contract import tensor_specs
from tests.helpers.sync_fake_receiver import BufferEngine, PeftEngine, tiny_llama, token_logprobs

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
        DistributedSync("tests.helpers.sync_fake_receiver:build_failing_engine", timeout_s=10)


@pytest.mark.timeout(60)
def test_worker_that_never_starts_is_stopped():
    with pytest.raises(TimeoutError, match="sent no 'ready' in 3 s; it was stopped"):
        DistributedSync("tests.helpers.sync_fake_receiver.build_stuck_engine", startup_timeout_s=3)


@pytest.mark.timeout(60)
def test_dead_worker_gives_an_error_not_a_hang():
    named = {"layer.lora_A": torch.randn(4, 8)}
    with DistributedSync(BufferEngine, (tensor_specs(named),), timeout_s=10) as sync:
        sync.push(named, 1)
        with pytest.raises(RuntimeError, match="died \\(exit code 3\\) before sending 'ack'"):
            sync.push(named, 13)
        with pytest.raises(RuntimeError, match="not running \\(exit code 3\\)"):
            sync.push(named, 2)


def test_nccl_carries_the_buckets_only_between_two_different_gpus():
    assert choose_backend("cpu", "cpu") == "gloo"
    assert choose_backend("cuda:GPU-a", "cpu") == "gloo"  # a trainer without CUDA
    assert choose_backend("cpu", "cuda:GPU-a") == "gloo"
    assert choose_backend("cuda:GPU-a", "cuda:GPU-a") == "gloo"  # one GPU: NCCL refuses two ranks on it
    assert choose_backend("cuda:GPU-a", "cuda:GPU-b") == "nccl"
    assert device_id("cpu") == device_id(torch.device("cpu")) == "cpu"


def check_cuda_pushes(worker_device: str, backend: str) -> None:
    """Pushes of CUDA tensors reach a worker's CUDA buffers: fp32 [4, 8] and bf16 [70, 3], 128 + 420 bytes in
    3 buckets of at most 256."""
    named = {
        "layer.lora_A": torch.randn(4, 8, device="cuda"),
        "layer.lora_B": torch.randn(70, 3, device="cuda").bfloat16(),
    }
    with DistributedSync(
        BufferEngine, (tensor_specs(named), worker_device), bucket_bytes=256, timeout_s=60
    ) as sync:
        assert sync.backend == backend
        for version in (1, 2):
            randomize(named, seed=version)
            assert sync.push(named, version).num_buckets == 3
            acked, weights = sync.call("weights")
            assert acked == version and all(torch.equal(weights[n], named[n].cpu()) for n in named)


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_a_worker_on_the_trainers_own_gpu_is_synced_over_gloo():
    check_cuda_pushes("cuda:0", "gloo")


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="NCCL between the trainer and its rollout worker needs two GPUs",
)
def test_a_worker_on_another_gpu_is_synced_over_nccl():
    check_cuda_pushes("cuda:1", "nccl")
