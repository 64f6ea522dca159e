"""Playing GRPO groups out: the engine samples, the environment answers, turn by turn.

Each prompt's G episodes are sampled as one engine request with n=G, so they share the prompt's KV blocks.
In multi-turn episodes the environment's observation tokens are appended to the sample (loss mask 0) and all
unfinished episodes are continued together in one batched call; their earlier turns come from the prefix
cache.
This module is duck-typed against the engine (`generate`) and the episodes (`messages`, `step`), so it imports
neither the engine nor the environments.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from rl.rollout.prompts import prompt_token_ids
from rl.seeding import derive_seed


@dataclass(slots=True)
class Trajectory:
    """One episode: the prompt, then policy tokens interleaved with observation tokens."""

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    completion_mask: list[int] = field(default_factory=list)  # 1 = sampled by the policy, 0 = observation
    logprobs: list[float] = field(default_factory=list)  # the engine's logprob per completion token, 0 on obs
    supports: list[tuple[int, ...]] = field(default_factory=list)  # per completion token, Completion.support
    reward: float = 0.0
    rewards: dict[str, float] = field(default_factory=dict)
    truncated: bool = False
    num_turns: int = 0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)  # the env's info of the episode's last step
    error: str | None = None  # the env plugin's failure (an exception, a bad reward, a timeout)
    timed_out: bool = False  # the plugin's step ran past its time limit
    text: str = ""
    demonstration: bool = False  # the env's ideal reply put in the group (rl.job.guidance), not sampled

    def append(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float] | None,
        supports: Sequence[tuple[int, ...]] | None = None,
    ) -> None:
        """Add sampled tokens, with their logprobs and supports (`Completion.support`), or, with logprobs
        None, observation tokens."""
        self.completion_ids.extend(token_ids)
        self.completion_mask.extend([int(logprobs is not None)] * len(token_ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(token_ids))
        self.supports.extend(supports or [()] * len(token_ids))


def play_groups(
    engine: Any,
    tokenizer: Any,
    groups: Sequence[Sequence[Any]],
    params: Any,
    step_fn: Callable[[Sequence[Any], Sequence[str]], list[Any]],
    max_completion_tokens: int,
    response_prefix: str = "",
    on_done: Callable[[int], None] | None = None,
) -> list[list[Trajectory]]:
    """Play every group's episodes to the end; `groups[i]` holds the G episodes of prompt i.

    `params` is the engine's SamplingParams with n=G; continuations reuse it with n=1 and a derived seed.
    `step_fn(episodes, actions)` steps many episodes at once (envs.step_episodes). An episode ends when the
    environment says done, at its max_turns, or when its completion reaches `max_completion_tokens`
    (truncated). `response_prefix` (an env's declared start of every first reply) ends each prompt, so it
    is never trained on, and is put back in front of the first action the environment sees. `on_done(n)`
    hears of the groups as they end, n at a time (`GroupCountdown`), for a caller's progress bar. An episode's
    `constraint` (optional, e.g. `envs.sql.schema_constraint.SchemaNames`) vetoes tokens of its replies in
    the engine.
    """
    prompts = [prompt_token_ids(tokenizer, group[0].messages, response_prefix) for group in groups]
    trajectories = [[Trajectory(prompt_ids=list(p)) for _ in g] for p, g in zip(prompts, groups, strict=True)]
    countdown = GroupCountdown(groups, on_done)
    requests = [[(i, g) for g in range(len(group))] for i, group in enumerate(groups)]  # one per group
    first = [replace(params, constraint=getattr(group[0], "constraint", None)) for group in groups]
    results = engine.generate(prompts, first, on_finished=partial(countdown.replied, requests, 1))
    active = [key for keys in requests for key in keys]
    samples = [sample for result in results for sample in result.samples]
    turn = 0
    while active:
        turn += 1
        episodes = [groups[i][g] for i, g in active]
        trajs = [trajectories[i][g] for i, g in active]
        for traj, sample in zip(trajs, samples, strict=True):
            traj.append(sample.token_ids, sample.logprobs, sample.support)
            traj.num_turns = turn
            traj.truncated = sample.finish_reason == "length"
        prefix = response_prefix if turn == 1 else ""
        actions = [prefix + tokenizer.decode(s.token_ids, skip_special_tokens=True) for s in samples]
        for traj, step in zip(trajs, step_fn(episodes, actions), strict=True):
            record_step(traj, step, tokenizer, max_completion_tokens)
        still = [(key, t) for key, t, e in zip(active, trajs, episodes, strict=True) if _continues(t, e)]
        continuing = {key for key, _ in still}
        countdown.ended(key for key in active if key not in continuing)
        active = [key for key, _ in still]
        if not active:
            break
        continuations = [t.prompt_ids + t.completion_ids for _, t in still]
        room = min(params.max_tokens, max_completion_tokens - max(len(t.completion_ids) for _, t in still))
        next_params = replace(params, n=1, max_tokens=max(room, 1), seed=_turn_seed(params.seed, turn))
        each = [replace(next_params, constraint=getattr(groups[i][g], "constraint", None)) for i, g in active]
        replied = partial(countdown.replied, [[key] for key in active], turn + 1)  # one per episode
        samples = [r.samples[0] for r in engine.generate(continuations, each, on_finished=replied)]
    for group in trajectories:
        for traj in group:
            traj.text = response_prefix + tokenizer.decode(traj.completion_ids, skip_special_tokens=True)
    return trajectories


class GroupCountdown:
    """Counts down each group's episodes as they end and calls `on_done(n)` as the last ones of n groups have.

    An episode whose reply comes on its last allowed turn ends with that reply, so it is counted as soon as
    the engine finishes it (progress moves during a long generate call); one that ends earlier, when its
    env says done or its completion runs out of room, is counted after the env's step."""

    def __init__(self, groups: Sequence[Sequence[Any]], on_done: Callable[[int], None] | None) -> None:
        self.groups = groups
        self.left = [len(group) for group in groups]
        self.counted: set[tuple[int, int]] = set()
        self.on_done = on_done

    def replied(self, requests: Sequence[Sequence[tuple[int, int]]], turn: int, request: int) -> None:
        """The engine finished request `request` of turn `turn`, which played the episodes
        `requests[request]` ((group, episode) keys)."""
        self.ended(key for key in requests[request] if turn >= self.groups[key[0]][key[1]].max_turns)

    def ended(self, keys: Iterable[tuple[int, int]]) -> None:
        """These episodes are over; the groups whose episodes are now all over are reported at once."""
        if self.on_done is None:
            return
        num_done = 0
        for key in keys:
            if key in self.counted:
                continue
            self.counted.add(key)
            self.left[key[0]] -= 1
            num_done += self.left[key[0]] == 0
        if num_done:
            self.on_done(num_done)


def record_step(traj: Trajectory, step: Any, tokenizer: Any, max_completion_tokens: int) -> None:
    """Add an env step's reward, info and observation tokens to the episode; end it when done or full."""
    traj.reward += step.reward
    for name, value in step.rewards.items():
        traj.rewards[name] = traj.rewards.get(name, 0.0) + value
    traj.info = step.info
    traj.error, traj.timed_out = step.error, step.timed_out
    traj.done = step.done
    if not step.done and step.observation:
        traj.append(tokenizer.encode(step.observation, add_special_tokens=False), None)
    if len(traj.completion_ids) >= max_completion_tokens and not traj.done:
        traj.truncated, traj.done = True, True


def _continues(traj: Trajectory, episode: Any) -> bool:
    return not traj.done and traj.num_turns < episode.max_turns


def _turn_seed(seed: int | None, turn: int) -> int | None:
    return None if seed is None else derive_seed(turn, seed)  # turn 0 samples with the request's seed


def succeeded(env: Any, trajectory: Trajectory) -> bool:
    """Whether `env` counts the played episode as solved (its `is_success`); a reward or component that is
    not a finite number (which `envs.step_episodes` never lets through) is never a success."""
    values = [trajectory.reward, *trajectory.rewards.values()]
    return all(map(math.isfinite, values)) and env.is_success(trajectory)


def group_outcomes(env: Any, tasks: Sequence[Any], played: Sequence[Sequence[Trajectory]]) -> list[tuple]:
    """(task row, successes, attempts) of each task's played group: what a task order records."""
    return [(task, sum(succeeded(env, t) for t in g), len(g)) for task, g in zip(tasks, played, strict=True)]
