"""An arithmetic environment: one question, an answer in <answer> tags, and retries while turns remain.

What makes it learnable for a small model in minutes: it shows the ideal first reply (``demonstration``,
which the warm start trains on: the untouched SmolLM2-135M explains at length and never writes the tag),
ends a turn at the closing tag (``stop``), and its config (``conf/env/arith.yaml``, with the recipe in
``conf/recipe/arith.yaml``) asks questions on operands up to 20, as distinct tasks so that no held-out
question is trained on.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from datasets import Dataset

from envs import BaseEnv, ScoreWords, StepResult, WeightedRewards

_ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")
_INSTRUCTIONS = "Solve the arithmetic problem. Give only the final integer inside <answer></answer>."


def make_tasks(num_tasks: int, seed: int = 0, max_operand: int = 99) -> Dataset:
    """``num_tasks`` distinct rows with ``question`` ("What is 12 * 7?"), the integer ``answer`` and the
    operator ``op``, on operands from 0 to ``max_operand``."""
    possible = 3 * (max_operand + 1) ** 2
    if not 0 < num_tasks <= possible:
        raise ValueError(
            f"num_tasks={num_tasks}: operands up to {max_operand} make {possible} distinct questions; ask "
            "for 1 to that many, or raise max_operand"
        )
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < num_tasks:
        a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice("+-*")
        question = f"What is {a} {op} {b}?"
        if question in seen:
            continue
        seen.add(question)
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        rows.append({"question": question, "answer": answer, "op": op})
    return Dataset.from_list(rows)


def parse_answer(completion: str) -> int | None:
    """The integer in the last <answer> tag, or None."""
    found = _ANSWER.findall(completion)
    return int(found[-1]) if found else None


def correct(task: Mapping[str, Any], completion: str) -> float:
    """1.0 when the answer equals ``task['answer']``."""
    return float(parse_answer(completion) == int(task["answer"]))


class ArithEpisode:
    def __init__(self, task: Mapping[str, Any], max_turns: int, rewards: WeightedRewards) -> None:
        self.task = task
        self.max_turns = max_turns
        self.messages = [
            {"role": "system", "content": _INSTRUCTIONS},
            {"role": "user", "content": task["question"]},
        ]
        self.num_turns = 0
        self._rewards = rewards

    def step(self, action_text: str) -> StepResult:
        """Grade the answer; a wrong or missing one gets another try while turns remain."""
        self.num_turns += 1
        breakdown = self._rewards(self.task, action_text)
        answered = parse_answer(action_text) is not None
        if breakdown.total > 0 or self.num_turns >= self.max_turns:
            return StepResult(None, breakdown.total, True, {"answered": answered}, breakdown.components)
        hint = "Incorrect, try again." if answered else "No <answer>integer</answer> found."
        return StepResult(f"\n<observation>{hint}</observation>\n", 0.0, False, {"answered": answered})


class ArithEnv(BaseEnv):
    """Arithmetic questions; ``max_turns`` tries per question. A success is a positive reward (the default):
    the right number."""

    stop = ("</answer>",)  # the answer is complete: the env takes over
    score_words = ScoreWords(success="answer accuracy", tasks="unseen questions")

    def __init__(self, max_turns: int = 2) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns
        self.rewards = WeightedRewards({"correct": (correct, 1.0)})

    def demonstration(self, task: Mapping[str, Any]) -> str:
        """The ideal first reply: the right number in its tag (what the warm start trains on)."""
        return f"<answer>{task['answer']}</answer>"

    def start(self, task: Mapping[str, Any]) -> ArithEpisode:
        return ArithEpisode(task, self.max_turns, self.rewards)
