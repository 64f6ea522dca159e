"""Two DDP ranks holding unequal token counts reproduce the single-process whole-batch gradient: on the CPU
over gloo, and on two GPUs over NCCL."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl.algo.losses import LossConfig
from rl.algo.trainer import accumulate_gradients
from tests.helpers import ddp_grad_worker as worker

REPO = Path(__file__).resolve().parents[2]


# fp32 on the GPUs sums in other orders than the CPU reference
TOLERANCES = {"cpu": 1e-5, "cuda": 1e-4}


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(
                    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="NCCL data parallelism needs a GPU per rank: two GPUs",
                ),
            ],
        ),
    ],
)
def test_ddp_matches_single_process(tmp_path, make_llama, make_lora, make_batch, device):
    pythonpath = f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    done = subprocess.run(
        [*cmd, "-m", worker.__name__, str(tmp_path), device],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    model, batch = make_lora(make_llama(), perturb=True), make_batch()
    # rows 0-2 hold 13 loss tokens, rows 3-5 hold 9: a plain per-rank token mean would be wrong for dapo
    assert batch.loss_mask[:3].sum() != batch.loss_mask[3:].sum()
    old = worker.stale_old_logprobs(model, batch)
    for loss_type in worker.LOSS_TYPES:
        accumulate_gradients(
            model, batch, LossConfig(loss_type=loss_type), micro_batch_size=6, max_completion_length=8,
            old_logprobs=old,
        )  # fmt: skip
        for name, param in model.named_parameters():
            if param.requires_grad:
                for grads in ranks:
                    torch.testing.assert_close(
                        grads[loss_type][name], param.grad, atol=TOLERANCES[device], rtol=0
                    )
        model.zero_grad(set_to_none=True)
