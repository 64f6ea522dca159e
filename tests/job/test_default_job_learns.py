"""The point of the project: a shortened default job on the real model lifts held-out accuracy (-m slow).

The default recipe (conf/train.yaml) measured 0.020 on the 200 held-out tasks for the untouched model and
0.685 after its 50-step warm start alone (seeds 0 and 1 see the same held-out set). This shortened job (20
warm-start steps, 2 GRPO steps, 100 of those tasks) measured 0.02 -> 0.40 -> 0.41 and must clear the base
model by 0.25: 0.14 below what it measured, and more than twice the largest 95% half-interval at 100 tasks
(0.098). It takes about 4 minutes.
"""

import json

import pytest
import torch
from hydra import compose, initialize_config_dir

import train
from rl.config.schema import register_configs
from tests.helpers.train_runs import REPO

SHORT = [
    "sft.steps=20",
    "num_steps=2",
    "eval_every=0",
    "checkpoint_every=0",
    "env.eval_tasks=100",
    "rollout.memory_budget_bytes=4000000000",
    "logger.wandb.mode=disabled",
    "logger.progress=false",
]
MARGIN = 0.25


@pytest.mark.slow
def test_a_shortened_default_job_lifts_held_out_accuracy_well_above_the_base(tmp_path):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[*SHORT, f"run_dir={tmp_path}"])
    torch.manual_seed(cfg.seed)
    result = train.train(cfg)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["num_eval_tasks"] == 100
    assert summary["base_accuracy"] == result.evals[0].result.accuracy
    assert summary["final_accuracy"] >= summary["base_accuracy"] + MARGIN, summary["eval_history"]
