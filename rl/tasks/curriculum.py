"""An adaptive curriculum: training tasks are drawn by their running pass rate, where GRPO learns most.

A GRPO group only teaches when its rewards differ, and with a binary success the expected spread of a
task that passes with probability p is p(1 - p). So each task is drawn with weight p(1 - p) of its
estimated pass rate, and a task whose own record shows it mastered (every attempt passed) or hopeless
(none did) over at least ``min_attempts`` attempts is skipped.

Few tasks are drawn twice in a short run, so a task's estimate borrows from its pool: the tasks that share
the ``pool_by`` fields (e.g. query family and difficulty). The pool's rate has a Beta(1, 1) prior, so
untried pools start at 0.5 (the highest weight: they are explored first), and a task's own attempts count
against ``prior_strength`` pseudo-attempts at the pool's rate. Same seed and same outcomes give the same
draws; ``position`` / ``restore`` make it resumable like ``rl.tasks.stream.TaskStream``.

A task's own record starts at GRPO's first step unless the run screens (``screen_tasks``): before that step,
a seeded draw of that many training tasks is sampled ``screen_samples`` times each (``rl.job.screen``), the
outcomes are recorded, and the screened tasks that every sample solved or none did are dropped at once, so
the steps spend their groups on tasks whose samples differ, and the pools start from measured rates.

With ``group_by`` (e.g. ``db_id``), a batch is filled one group at a time: a group is drawn by the sum of
its tasks' weights, then tasks within it by their own, and the next group only when it runs out. The
prompts of one database then share its schema, which the engine's prefix cache and the trainer's shared
prefix (``rl.algo.logprobs``) each compute once for the whole step instead of once a prompt.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rl.seeding import derive_seed
from rl.settings import ConfigError, Settings, at_least


@dataclass
class CurriculumConfig(Settings):
    """Draw training tasks by their running pass rate instead of in seeded epochs (the curriculum.* keys)."""

    RULES = (
        ("prior_strength", at_least(0), "use a finite number >= 0"),
        ("min_attempts", at_least(1), "use an integer >= 1"),
        ("screen_tasks", at_least(0), "use an integer >= 0 (0: no screen)"),
        ("screen_samples", at_least(2), "use an integer >= 2 (one sample cannot tell a learnable task)"),
    )

    enabled: bool = False
    pool_by: list[str] = field(default_factory=list)  # task fields whose tasks share a pass-rate estimate
    prior_strength: float = 8.0  # pseudo-attempts of the pool's rate in each task's estimate
    min_attempts: int = 16  # a task all-passed or all-failed over this many attempts is skipped
    # task field whose tasks a batch draws together (db_id: one database's questions, which share a schema)
    group_by: str | None = None
    # before GRPO's first step, this many training tasks are sampled screen_samples times each, and those
    # all solved or all failed are dropped (0: no screen)
    screen_tasks: int = 0
    screen_samples: int = 4


def task_key(task: Any) -> str:
    """A stable identity of a task row (its content), the same on every rank and after a resume."""
    return hashlib.sha1(json.dumps(task, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Curriculum:
    """Draws batches of task rows by p(1 - p) of their estimated pass rate; ``record`` feeds outcomes."""

    def __init__(
        self,
        tasks: Sequence[Any],
        seed: int = 0,
        pool_by: Sequence[str] = (),
        prior_strength: float = CurriculumConfig.prior_strength,
        min_attempts: int = CurriculumConfig.min_attempts,
        group_by: str | None = None,
    ) -> None:
        if len(tasks) == 0:
            raise ConfigError("the task set is empty; check the env's tasks config (env.tasks)")
        self.tasks = tasks
        self.seed = seed
        self.prior_strength = prior_strength
        self.min_attempts = min_attempts
        self._keys = [task_key(t) for t in tasks]
        self._pools = [
            "/".join(str(t.get(f, "")) if hasattr(t, "get") else "" for f in pool_by) for t in tasks
        ]
        self._index = {key: i for i, key in enumerate(self._keys)}
        self._group_of = None  # each task's group number, with group_by
        if group_by:
            if not any(hasattr(t, "get") and group_by in t for t in tasks):
                raise ConfigError(
                    f"curriculum.group_by={group_by}: no training task has a field {group_by!r}; name one "
                    "of the tasks' fields (db_id for the SQL envs), or null to draw tasks one by one"
                )
            groups = [str(t.get(group_by, "")) if hasattr(t, "get") else "" for t in tasks]
            number = {name: i for i, name in enumerate(sorted(set(groups)))}
            self._group_of = torch.tensor([number[g] for g in groups])
        self.record_of: dict[str, list[int]] = {}  # task key -> [successes, attempts]
        self.dropped: set[str] = set()  # keys of the tasks the screen found solved or hopeless
        self.draws = 0

    def pool_rates(self) -> dict[str, float]:
        """Each pool's posterior mean pass rate (Beta(1, 1) prior)."""
        totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for key, (wins, tries) in self.record_of.items():
            pool = totals[self._pools[self._index[key]]]
            pool[0] += wins
            pool[1] += tries
        return {pool: (totals[pool][0] + 1) / (totals[pool][1] + 2) for pool in set(self._pools)}

    def weights(self) -> torch.Tensor:
        """[num_tasks] draw weights: p(1 - p) of each task's estimate, 0 for mastered or hopeless ones."""
        rates = self.pool_rates()
        prior = self.prior_strength
        out = torch.empty(len(self.tasks), dtype=torch.float64)
        for i, key in enumerate(self._keys):
            wins, tries = self.record_of.get(key, (0, 0))
            if key in self.dropped or self._settled(wins, tries):
                out[i] = 0.0
                continue
            p = (wins + prior * rates[self._pools[i]]) / (tries + prior) if tries + prior > 0 else 0.5
            out[i] = p * (1.0 - p)
        return out

    def _settled(self, wins: int, tries: int) -> bool:
        """Mastered or hopeless: every one of at least min_attempts attempts passed, or none did."""
        return tries >= self.min_attempts and wins in (0, tries)

    def next_batch(self, batch_size: int) -> list[Any]:
        """``batch_size`` distinct rows (repeats only when fewer tasks are left to draw), one ``group_by``
        group after another when that is set."""
        weights = self.weights()
        if weights.sum() <= 0:  # everything is mastered or hopeless: draw uniformly
            weights = torch.ones_like(weights)
        generator = torch.Generator().manual_seed(derive_seed(self.seed, self.draws))
        self.draws += 1
        live = int((weights > 0).sum())
        if self._group_of is None:
            picks = torch.multinomial(weights, min(batch_size, live), replacement=False, generator=generator)
            picked = picks.tolist()
        else:
            picked = self._grouped_picks(weights, min(batch_size, live), generator)
        rows = [self.tasks[i] for i in picked]
        while len(rows) < batch_size:
            rows += rows[: batch_size - len(rows)]
        return rows

    def _grouped_picks(self, weights: torch.Tensor, count: int, generator: torch.Generator) -> list[int]:
        """``count`` distinct task indices: a group drawn by its total weight, then its tasks by theirs,
        until the batch is full."""
        group_of = self._group_of
        left = weights.clone()
        picked: list[int] = []
        while len(picked) < count:
            totals = torch.zeros(int(group_of.max()) + 1, dtype=left.dtype).index_add_(0, group_of, left)
            group = int(torch.multinomial(totals, 1, generator=generator))
            members = torch.where(group_of == group, left, torch.zeros_like(left))
            take = min(count - len(picked), int((members > 0).sum()))
            chosen = torch.multinomial(members, take, replacement=False, generator=generator)
            left[chosen] = 0.0
            picked += chosen.tolist()
        return picked

    def record(self, outcomes: Sequence[tuple[Any, int, int]]) -> None:
        """Add ``(task row, successes, attempts)`` outcomes; rows not in the training set are ignored."""
        for task, wins, tries in outcomes:
            key = task_key(task)
            if key not in self._index:
                continue
            entry = self.record_of.setdefault(key, [0, 0])
            entry[0] += int(wins)
            entry[1] += int(tries)

    def screen(self, outcomes: Sequence[tuple[Any, int, int]]) -> tuple[int, int]:
        """Record the screen's ``(task row, successes, attempts)`` and drop the tasks that every attempt
        solved or none did; returns how many were (solved, hopeless)."""
        self.record(outcomes)
        solved = hopeless = 0
        for task, wins, tries in outcomes:
            key = task_key(task)
            if key not in self._index or 0 < wins < tries:
                continue
            solved, hopeless = solved + (wins == tries), hopeless + (wins == 0)
            self.dropped.add(key)
        return solved, hopeless

    def metrics(self) -> dict[str, float]:
        """The pools' pass rates (``curriculum/pass_rate/<pool>``) and how many tasks are skipped (settled
        by their record, or dropped by the screen)."""
        out = {
            f"curriculum/pass_rate/{pool or 'all'}": rate for pool, rate in sorted(self.pool_rates().items())
        }
        settled = {key for key, (w, t) in self.record_of.items() if self._settled(w, t)}
        out["curriculum/num_skipped"] = float(len(settled | self.dropped))
        return out

    def position(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "draws": self.draws,
            "records": self.record_of,
            "dropped": sorted(self.dropped),
        }

    def restore(self, position: dict[str, Any]) -> None:
        if position.get("seed", self.seed) != self.seed or "records" not in position:
            raise ConfigError(
                "the checkpoint's data position is not this run's curriculum (another seed, or a run "
                "without curriculum.enabled); resume with the same seed and curriculum settings"
            )
        self.draws = int(position["draws"])
        self.record_of = {key: [int(w), int(t)] for key, (w, t) in position["records"].items()}
        self.dropped = set(position.get("dropped", ()))
