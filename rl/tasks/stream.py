"""A resumable stream of task rows: seeded shuffles, one epoch after another."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rl.seeding import derive_seed
from rl.settings import ConfigError


class TaskStream:
    """Yields batches of task rows in a seeded order; `position()` / `restore()` make it resumable."""

    def __init__(self, tasks: Sequence[Any], seed: int = 0) -> None:
        if len(tasks) == 0:
            raise ConfigError("the task set is empty; check the env's tasks config (env.tasks)")
        self.tasks = tasks
        self.seed = seed
        self.epoch = 0
        self.index = 0
        self._order = self._shuffle(0)

    def _shuffle(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(derive_seed(self.seed, epoch))
        return torch.randperm(len(self.tasks), generator=generator).tolist()

    def next_batch(self, batch_size: int) -> list[Any]:
        """The next `batch_size` rows, wrapping into a freshly shuffled epoch when one runs out."""
        rows = []
        while len(rows) < batch_size:
            if self.index == len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._shuffle(self.epoch)
            rows.append(self.tasks[self._order[self.index]])
            self.index += 1
        return rows

    def record(self, outcomes: Sequence[tuple[Any, int, int]]) -> None:
        """Outcomes do not change a seeded epoch's order (the curriculum's do)."""

    def metrics(self) -> dict[str, float]:
        return {}

    def position(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed}

    def restore(self, position: dict[str, int]) -> None:
        if position.get("seed", self.seed) != self.seed:
            raise ConfigError(
                f"checkpoint data seed {position['seed']} differs from this run's seed {self.seed}; "
                f"resume with seed={position['seed']}"
            )
        self.epoch, self.index = int(position["epoch"]), int(position["index"])
        self._order = self._shuffle(self.epoch)
