"""SQL environments: sandboxed SQLite execution (``sandbox``), execution match (``match``), grading and its
reward components (``grading``), what the envs share (``execution_env``), prompts, the schema constraint on
replies (``schema_constraint``), and the single- and multi-turn envs.

Task sources live in ``envs.sql.generator`` (built-in tasks) and ``envs.sql.loaders`` (Spider and BIRD).
"""

from envs.sql.match import GoldQueryError, execution_match, has_top_level_order_by
from envs.sql.multi_turn import SqlMultiTurnEnv
from envs.sql.prompts import extract_sql, render_schema
from envs.sql.sandbox import QueryResult, execute
from envs.sql.single_turn import SqlEnv

__all__ = [
    "GoldQueryError",
    "QueryResult",
    "SqlEnv",
    "SqlMultiTurnEnv",
    "execute",
    "execution_match",
    "extract_sql",
    "has_top_level_order_by",
    "render_schema",
]
