"""Environments: the env contract (``BaseEnv``, which holds the optional features' defaults), reward
combination, the registry, safe stepping, and the built-in SQL environments."""

from envs.base import (
    BaseEnv,
    EnvError,
    Episode,
    PlayedEpisode,
    ScoreWords,
    StepResult,
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
    "BaseEnv",
    "DEFAULT_STEP_TIMEOUT_S",
    "ENTRY_POINT_GROUP",
    "EnvError",
    "Episode",
    "PlayedEpisode",
    "RewardBreakdown",
    "RewardFn",
    "ScoreWords",
    "StepResult",
    "WeightedRewards",
    "available_envs",
    "make_env",
    "plugin_config_dirs",
    "plugin_env_config",
    "start_episodes",
    "step_episodes",
]
