"""Environments: the Env protocol, reward combination, the registry, and the built-in SQL environments."""

from envs.base import (
    Env,
    EnvError,
    Episode,
    ScoreWords,
    StepResult,
    score_words,
    start_episodes,
)
from envs.registry import (
    BUILTIN_ENVS,
    ENTRY_POINT_GROUP,
    available_envs,
    make_env,
    plugin_config_dirs,
    plugin_env_config,
)
from envs.rewards import RewardBreakdown, RewardFn, WeightedRewards
from envs.stepping import DEFAULT_STEP_TIMEOUT_S, step_episodes

__all__ = [
    "BUILTIN_ENVS",
    "DEFAULT_STEP_TIMEOUT_S",
    "ENTRY_POINT_GROUP",
    "Env",
    "EnvError",
    "Episode",
    "RewardBreakdown",
    "RewardFn",
    "ScoreWords",
    "StepResult",
    "WeightedRewards",
    "available_envs",
    "make_env",
    "plugin_config_dirs",
    "plugin_env_config",
    "score_words",
    "start_episodes",
    "step_episodes",
]
