"""Off-policy guidance (LUFFY, Yan et al. 2025, arXiv 2504.14945): demonstrations in groups that all failed.

A GRPO group whose G samples all fail has (nearly) equal rewards, so it carries no advantage: the questions
the policy cannot yet solve teach it nothing. With ``algo.guidance``, the env's demonstration of such a
group's task (``env.demonstration``, the warm start's ideal reply) replaces the group's last sample when the
env counts it as a success. The group then holds one success among failures: its advantage pulls the policy
towards the demonstration and away from the failed samples, on exactly the questions it gets wrong.

The demonstration is played like a reply (the env scores it) and its "sampling" logprobs are the trainer's
own, at the sampling temperature, so the update treats it as on-policy: ratio 1, importance weight 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from envs import step_episodes
from rl.algo.batch import collate_rollouts
from rl.algo.trainer import batch_logprobs
from rl.job.demos import demonstration_ids
from rl.rollout.play import Trajectory, record_step, succeeded


def guide_failed_groups(
    env: Any,
    tokenizer: Any,
    model: torch.nn.Module,
    groups: Sequence[Sequence[Trajectory]],
    tasks: Sequence[Mapping[str, Any]],
    *,
    micro_batch_size: int,
    temperature: float,
    max_completion_tokens: int,
    timeout_s: float,
) -> list[list[Trajectory]]:
    """The groups, each that no sample solved with its last sample replaced by the task's demonstration
    (marked ``demonstration``), where the env gives one that it scores as solved."""
    guided = [list(group) for group in groups]
    offered = []
    for i, (group, task) in enumerate(zip(groups, tasks, strict=True)):
        if any(succeeded(env, t) for t in group):
            continue
        text = env.demonstration(task)
        ids = demonstration_ids(text, env.response_prefix, tokenizer)
        if ids is not None:
            offered.append((i, text, ids))
    if not offered:
        return guided
    steps = step_episodes(
        [env.start(tasks[i]) for i, _, _ in offered], [text for _, text, _ in offered], timeout_s
    )
    demos = []
    for (i, text, ids), step in zip(offered, steps, strict=True):
        demo = Trajectory(
            prompt_ids=list(guided[i][0].prompt_ids), num_turns=1, demonstration=True, text=text
        )
        demo.append(ids, [0.0] * len(ids))
        record_step(demo, step, tokenizer, max_completion_tokens)
        if demo.done and succeeded(env, demo):
            demos.append((i, demo))
    if not demos:
        return guided
    batch = collate_rollouts(
        prompt_ids=[d.prompt_ids for _, d in demos],
        completion_ids=[d.completion_ids for _, d in demos],
        completion_logprobs=[d.logprobs for _, d in demos],
        advantages=torch.zeros(len(demos)),
        truncated=[False] * len(demos),
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.no_grad():
        logprobs = batch_logprobs(model, batch, micro_batch_size, temperature).cpu()
    for row, (i, demo) in enumerate(demos):
        start = len(demo.prompt_ids)
        demo.logprobs = logprobs[row, start : start + len(demo.completion_ids)].tolist()
        guided[i][-1] = demo
    return guided
