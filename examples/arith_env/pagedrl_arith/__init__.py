"""Example pagedrl environment plugin: arithmetic questions."""

from pagedrl_arith.env import ArithEnv, ArithEpisode, make_tasks

__all__ = ["ArithEnv", "ArithEpisode", "make_tasks"]
