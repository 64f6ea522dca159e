"""Run by test_ddp_gradients.py under torch.distributed.run: 2 CPU ranks (gloo), rows 0-2 and 3-5."""

import sys

import torch
from conftest import rollout_batch, tiny_llama, with_lora
from torch.nn.parallel import DistributedDataParallel

from rl.algo.losses import LossConfig
from rl.algo.trainer import accumulate_gradients, batch_logprobs
from rl.job.distributed import close_distributed, init_distributed

LOSS_TYPES = ("grpo", "dapo", "dr_grpo")


def stale_old_logprobs(model, batch):
    """Shared by the ranks and the single-process reference: current logprobs plus seeded noise."""
    noise = 0.3 * torch.randn(batch.input_ids.shape, generator=torch.Generator().manual_seed(5))
    return batch_logprobs(model, batch, 6) + noise


def main(out_dir: str) -> None:
    torch.set_num_threads(1)
    info = init_distributed("cpu")
    rank = info.rank
    model = with_lora(tiny_llama(), perturb=True)
    batch = rollout_batch()
    old = stale_old_logprobs(model, batch)
    shard = batch.rows(3 * rank, 3 * rank + 3)
    ddp = DistributedDataParallel(model)
    grads = {}
    for loss_type in LOSS_TYPES:
        accumulate_gradients(
            ddp, shard, LossConfig(loss_type=loss_type), micro_batch_size=2, max_completion_length=8,
            old_logprobs=old[3 * rank : 3 * rank + 3, : shard.input_ids.size(1)],
        )  # fmt: skip
        grads[loss_type] = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        model.zero_grad(set_to_none=True)
    torch.save(grads, f"{out_dir}/rank{rank}.pt")
    del ddp  # freed while the group is still registered (see close_distributed)
    close_distributed(info)


if __name__ == "__main__":
    main(sys.argv[1])
