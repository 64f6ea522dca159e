"""Reward functions are plain callables ``(task, completion) -> float``, combined with weights."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

RewardFn = Callable[[Mapping[str, Any], str], float]


@dataclass(slots=True)
class RewardBreakdown:
    """The weighted total and every component's unweighted value (logged as ``rewards/<name>``)."""

    total: float
    components: dict[str, float]


class WeightedRewards:
    """A named, weighted sum of reward functions; components with weight 0 are skipped."""

    def __init__(self, terms: Mapping[str, tuple[RewardFn, float]]) -> None:
        for name, term in terms.items():
            if not (isinstance(term, tuple) and len(term) == 2 and callable(term[0])):
                raise TypeError(f"reward term {name!r} must be (callable, weight), got {term!r}")
        self.terms = {name: (fn, float(weight)) for name, (fn, weight) in terms.items() if weight != 0}

    def __call__(self, task: Mapping[str, Any], completion: str) -> RewardBreakdown:
        components = {name: float(fn(task, completion)) for name, (fn, _) in self.terms.items()}
        total = sum(weight * components[name] for name, (_, weight) in self.terms.items())
        return RewardBreakdown(total=total, components=components)

    def zero(self) -> RewardBreakdown:
        """Every component at 0: an episode that ended without an answer."""
        return RewardBreakdown(total=0.0, components={name: 0.0 for name in self.terms})
