"""Run by test_ddp_gradients.py under torch.distributed.run: 2 ranks, rows 0-2 and 3-5, on the CPU (gloo) or
each on its own GPU (NCCL), as `python -m tests.helpers.ddp_grad_worker OUT_DIR [cpu|cuda]`."""

import sys

import torch

from rl.algo.losses import LossConfig
from rl.algo.trainer import accumulate_gradients, batch_logprobs
from rl.job.distributed import close_distributed, init_distributed, wrap_model
from tests.helpers.tiny_models import tiny_llama
from tests.helpers.trainer_batch import VOCAB, rollout_batch, with_lora

LOSS_TYPES = ("grpo", "dapo", "dr_grpo")


def stale_old_logprobs(model, batch):
    """Shared by the ranks and the single-process reference: current logprobs plus seeded noise."""
    noise = 0.3 * torch.randn(batch.input_ids.shape, generator=torch.Generator().manual_seed(5))
    logprobs = batch_logprobs(model, batch, 6)
    return logprobs + noise.to(logprobs.device)


def main(out_dir: str, device: str) -> None:
    torch.set_num_threads(1)
    info = init_distributed(device)
    rank = info.rank
    model = with_lora(tiny_llama(VOCAB), perturb=True).to(info.device)
    batch = rollout_batch()
    old = stale_old_logprobs(model, batch)
    shard = batch.rows(3 * rank, 3 * rank + 3)
    ddp = wrap_model(model, info)
    grads = {}
    for loss_type in LOSS_TYPES:
        accumulate_gradients(
            ddp, shard, LossConfig(loss_type=loss_type), micro_batch_size=2, max_completion_length=8,
            old_logprobs=old[3 * rank : 3 * rank + 3, : shard.input_ids.size(1)],
        )  # fmt: skip
        grads[loss_type] = {
            n: p.grad.to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad
        }
        model.zero_grad(set_to_none=True)
    torch.save(grads, f"{out_dir}/rank{rank}.pt")
    del ddp  # freed while the group is still registered (see close_distributed)
    close_distributed(info)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "cpu")
