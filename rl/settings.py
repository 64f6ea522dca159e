"""What a user's setting may hold: named choices, value ranges, and the error for a setting that cannot work.

Each component keeps the one list of the values it accepts (``LOSS_TYPES``, ``IS_MODES``, ``WANDB_MODES``
...); ``choices`` turns such a list into the str Enum that the Hydra schema types a key with, so a value
outside the list is refused when the config is composed. A ``Rule`` says what a type cannot (a range); each
is written once and checked once, before any work starts (``rl.job.config_checks``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from enum import Enum
from typing import Any

# (dotted key, whether a value is accepted, what the message tells the user to do otherwise)
Rule = tuple[str, Callable[[Any], bool], str]


class ConfigError(ValueError):
    """A value the user chose (a config key, a launch variable, a checkpoint to load) cannot work.

    The message names the setting and the fix; train.py prints it as one line. Any other exception is a
    bug and keeps its traceback.
    """


def choices(name: str, values: Iterable[str]) -> type[Enum]:
    """A str Enum whose members are `values`, each named as its value (``LossType.grpo == "grpo"``)."""
    return Enum(name, [(value, value) for value in values], type=str)


def choice(enum: type[Enum], value: Any, setting: str) -> Enum:
    """`value` (a member or its string) as a member of `enum`; ConfigError naming `setting` otherwise."""
    try:
        return enum(value)
    except ValueError:
        names = tuple(member.value for member in enum)
        raise ConfigError(f"unknown {setting} {value!r}; choose one of {names}") from None


def number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def at_least(low: float) -> Callable[[Any], bool]:
    return lambda v: number(v) and low <= v < math.inf


def positive(v: Any) -> bool:
    return number(v) and 0 < v < math.inf


def fraction(v: Any) -> bool:  # in (0, 1]
    return number(v) and 0 < v <= 1


def optional(rule: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or rule(v)


def rule_problems(rules: Sequence[Rule], values: Any, prefix: str = "") -> list[str]:
    """``"<prefix><key>=<value>: <fix>"`` for each rule whose key (dotted, read by attribute from `values`)
    holds a value the rule refuses."""
    problems = []
    for key, ok, fix in rules:
        value = functools.reduce(getattr, key.split("."), values)
        if not ok(value):
            problems.append(f"{prefix}{key}={value!r}: {fix}")
    return problems
