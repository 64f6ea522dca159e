"""One step on the real SmolLM2-135M with LoRA (slow: about 30 s on 2 CPU cores)."""

import pytest
import torch

from rl.algo.batch import collate_rollouts
from rl.algo.losses import LossConfig
from rl.algo.optim import build_optimizer
from rl.algo.trainer import train_step
from rl.job.model_loading import load_model
from rl.sync.adapter import add_lora


@pytest.mark.slow
def test_first_step_on_smollm2():
    model, _ = load_model("smollm2_135m", dtype="float32")
    model = add_lora(model, rank=8, alpha=16)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 49152, (12,), generator=gen).tolist() for _ in range(4)]
    completions = [torch.randint(1, 49152, (n,), generator=gen).tolist() for n in (16, 9, 12, 5)]
    advantages = torch.tensor([1.0, -0.5, 0.25, -0.75])
    batch = collate_rollouts(
        prompts, completions, [[-3.0] * len(c) for c in completions], advantages, [False] * 4, pad_token_id=0
    )
    stats = train_step(
        model, build_optimizer(model, lr=1e-4), None, batch, LossConfig(beta=0.04),
        micro_batch_size=2, max_grad_norm=1.0, temperature=1.0,
    )  # fmt: skip
    logged = stats.as_dict()
    # fresh adapter: policy == reference (kl 0) and ratio 1, so grpo loss = -mean(A)
    assert logged["loss"] == pytest.approx(-advantages.mean().item(), abs=1e-6)
    assert logged["kl"] == 0.0
    assert stats.num_tokens == 16 + 9 + 12 + 5
    assert stats.num_skipped_steps == 0 and 0.0 < stats.grad_norm < float("inf")
