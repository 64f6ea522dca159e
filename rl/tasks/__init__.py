"""The order training tasks come in: a resumable stream of seeded epochs (`stream`), or the adaptive
curriculum that draws tasks by their running pass rate (`curriculum`). Both are a `TaskOrder`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class TaskOrder(Protocol):
    """What a GRPO step asks of its task order: the next rows, the outcomes of the groups it played on them
    (``(task row, successes, attempts)``), its metrics, and a position to checkpoint and restore."""

    def next_batch(self, batch_size: int) -> list[Any]: ...

    def record(self, outcomes: Sequence[tuple[Any, int, int]]) -> None: ...

    def metrics(self) -> dict[str, float]: ...

    def position(self) -> dict[str, Any]: ...

    def restore(self, position: dict[str, Any]) -> None: ...
