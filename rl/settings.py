"""What a user's setting may hold: named choices, value ranges, and the error for a setting that cannot work.

Each component keeps the one list of the values it accepts (``LOSS_TYPES``, ``IS_MODES``, ``WANDB_MODES``
...); ``choices`` turns such a list into the str Enum that the Hydra schema types a key with, so a value
outside the list is refused when the config is composed. A ``Rule`` says what a type cannot (a range). Each
is written once, in the ``RULES`` of the ``Settings`` dataclass whose key it checks (``LossConfig``,
``LoraConfig``, ``rl.config.schema.RolloutConfig`` ...), and the config tree's are checked once, together,
before any work starts (``rl.config.checks``). A library function that takes such a value as a flat
argument (``add_lora(rank=...)``, ``train_step(micro_batch_size=...)``) applies the very same rule
(``check_args``), and a ``LossConfig`` built in Python checks itself with its own, so a message reads the same
wherever the value comes from.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Iterable, Sequence
from enum import Enum
from types import SimpleNamespace
from typing import Any, ClassVar

# (key: a field of its Settings, whether a value is accepted, what the message tells the user to do otherwise)
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
    """``"<prefix><key>=<value>: <fix>"`` for each rule whose key (read by attribute from `values`) holds a
    value the rule refuses."""
    problems = []
    for key, ok, fix in rules:
        value = getattr(values, key)
        if not ok(value):
            problems.append(f"{prefix}{key}={value!r}: {fix}")
    return problems


def refuse(problems: Sequence[str]) -> None:
    """One ConfigError naming every problem, if there is any."""
    if problems:
        raise ConfigError("; ".join(problems))


def check_args(rules: Sequence[Rule], **values: Any) -> None:
    """Refuse the flat arguments of a function that `rules` refuse, each argument checked by the rule keyed
    by its name: the check and the message of the setting it stands for."""
    refuse(rule_problems([rule for rule in rules if rule[0] in values], SimpleNamespace(**values)))


class Settings:
    """A settings dataclass (a group of config keys) that owns the rules of its keys: ``RULES``, each keyed by
    a field's name."""

    RULES: ClassVar[tuple[Rule, ...]] = ()

    @classmethod
    def problems(cls, values: Any, prefix: str = "") -> list[str]:
        """What `values` (an instance, or its node of the config tree: read by attribute) breaks of RULES,
        then of each field that is itself a Settings group, named under `prefix` and the field's key."""
        found = rule_problems(cls.RULES, values, prefix)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            group = hints[f.name]
            if isinstance(group, type) and issubclass(group, Settings):
                found += group.problems(getattr(values, f.name), f"{prefix}{f.name}.")
        return found
