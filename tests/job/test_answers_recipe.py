"""+experiment=spider_answers end to end on the tiny model and a Spider-shaped fixture: the warm start
demonstrates the labelled share alone, and GRPO plays the answer-only questions too."""

from __future__ import annotations

import json

import torch

import train
from envs.sql.loaders import spider_tasks
from rl.job.demos import demo_sampler
from rl.job.parts import build_parts
from tests.envs.test_sql_answers import QUERIES
from tests.envs.test_sql_loaders import spider_root
from tests.helpers.train_runs import compose_cfg


def recipe(tmp_path, *overrides):
    rows = [
        {"db_id": db_id, "question": f"Question {db_id}-{i}?", "query": QUERIES[i % len(QUERIES)]}
        for db_id in ("a", "b", "c", "d")
        for i in range(6)
    ]
    root = spider_root(tmp_path / "spider", rows)
    return compose_cfg(
        tmp_path / "run",
        "+experiment=spider_answers",
        f"env.tasks.root={root}",
        "env.tasks.test_fraction=0.25",
        "env.tasks.labelled_fraction=0.25",
        "env.eval_tasks=4",
        "sft.steps=2",
        "sft.batch_size=4",
        "num_steps=2",
        "eval_every=0",
        "curriculum.enabled=true",
        *overrides,
    )


def test_the_warm_start_and_the_anchor_draw_only_the_labelled_share(tmp_path):
    cfg = recipe(tmp_path)
    parts = build_parts(cfg)
    labelled = [task for task in parts.train_tasks if task["gold_sql"]]
    assert len(parts.train_tasks) == 18 and len(labelled) == round(0.25 * 18)
    assert demo_sampler(parts, cfg).num_demos == len(labelled)


def test_grpo_plays_answer_only_questions_and_logs_their_rewards(tmp_path):
    cfg = recipe(tmp_path)
    torch.manual_seed(cfg.seed)
    result = train.train(cfg)
    assert len(result.history) == 2
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    tasks = spider_tasks(**{k: v for k, v in cfg.env.tasks.items() if k != "_target_"})
    hidden = [task["question"] for task in tasks["train"] if not task["gold_sql"]]
    played = [q for q in hidden if any(q in sample["prompt"] for sample in samples)]
    assert played, "no GRPO sample came from an answer-only question"
    assert all(sample["reward"] in (0.0, 1.0) for sample in samples)  # execution match alone
