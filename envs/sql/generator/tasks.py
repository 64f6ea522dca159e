"""The generated task set: each family's quota of tasks per database, and the schema-disjoint split.

Every domain is written ``variants`` times, each under its own naming style (``naming``), so the same content
appears as ``customers.id`` in one database and ``Customer.Customer_ID`` in another. A task's ``family`` is
what its gold query shows (``envs.sql.loaders.sql_family``), the same labels real data gets.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable, Sequence

from datasets import Dataset, DatasetDict

from envs.sql.generator.datagen import TableData, domain_rows, write_database
from envs.sql.generator.domains import DOMAINS, TEST_DOMAINS, Domain
from envs.sql.generator.families import (
    Candidate,
    aggregate_family,
    filter_family,
    group_having_family,
    order_limit_family,
)
from envs.sql.generator.join_families import join2_family, join3_family, nested_family, set_ops_family
from envs.sql.generator.naming import draw_style, styled_domain
from envs.sql.loaders import sql_family
from envs.sql.prompts import render_schema
from envs.sql.sandbox import execute
from host.system import cache_dir

DIFFICULTIES = ("easy", "medium", "hard")
# Drawing family -> (draw function, tasks per database), near the mix of real questions, where joins are the
# most common kind (Spider's training set: a third join two tables, one in eight three or more).
FAMILIES: dict[str, tuple[Callable[[random.Random, dict[str, TableData]], Candidate | None], int]] = {
    "filter": (filter_family, 45),
    "aggregate": (aggregate_family, 40),
    "order_limit": (order_limit_family, 30),
    "group_having": (group_having_family, 35),
    "join2": (join2_family, 70),
    "join3": (join3_family, 30),
    "nested": (nested_family, 25),
    "set_ops": (set_ops_family, 20),
}
_ATTEMPTS_PER_TASK = 20


def database_path(db_dir: str, domain: Domain, seed: int) -> str:
    """Where a domain's database lives; the name hashes spec and seed, so an edited spec gets a new file."""
    digest = hashlib.sha1(f"{seed}:{domain!r}".encode()).hexdigest()[:10]
    return os.path.join(db_dir, f"{domain.db_id}-{digest}.sqlite")


def _usable(result_rows: list[tuple]) -> bool:
    return bool(result_rows) and result_rows != [(0,)] and result_rows != [(None,)]


def domain_tasks(
    domain: Domain, db_path: str, tables: dict[str, TableData], seed: int, scale: float
) -> list[dict]:
    """Draw each family's quota of distinct tasks whose gold query runs and returns a non-empty result."""
    rng = random.Random(f"tasks:{seed}:{domain.db_id}")
    schema = render_schema(db_path)
    tasks, seen = [], set()
    for draw, quota in FAMILIES.values():
        target, found = max(1, round(quota * scale)), 0
        for _ in range(target * _ATTEMPTS_PER_TASK):
            if found == target:
                break
            candidate = draw(rng, tables)
            if candidate is None or candidate.sql in seen:
                continue
            result = execute(db_path, candidate.sql, max_rows=1000)
            if not (result.ok and not result.truncated and _usable(result.rows)):
                continue
            seen.add(candidate.sql)
            found += 1
            tasks.append(
                {
                    "question": candidate.question,
                    "db_id": domain.db_id,
                    "db_path": db_path,
                    "gold_sql": candidate.sql,
                    "family": sql_family(candidate.sql),
                    "difficulty": candidate.difficulty,
                    "schema": schema,
                    "evidence": "",
                    "source": "generated",
                }
            )
    return tasks


def generate_sql_tasks(
    seed: int = 0,
    db_dir: str | None = None,
    test_domains: Sequence[str] = TEST_DOMAINS,
    scale: float = 1.0,
    difficulties: Sequence[str] = DIFFICULTIES,
    variants: int = 2,
) -> DatasetDict:
    """Train/test text-to-SQL tasks; test domains never appear in train. Deterministic for ``seed``.

    The SQLite files are written under ``db_dir`` (default ``sql_tasks/`` in the cache, ``$PAGEDRL_CACHE``
    or ``~/.cache/pagedrl``) once and reused. Each domain is written ``variants`` times in styles drawn from
    ``seed`` (db_ids ``retail``, ``retail_2``, ...); ``scale`` multiplies every family's quota per
    database; ``difficulties`` keeps only those labels.
    """
    known = {d.db_id for d in DOMAINS}
    unknown = sorted(set(test_domains) - known)
    if unknown:
        raise ValueError(f"unknown test domains {unknown}; choose from {sorted(known)}")
    bad = sorted(set(difficulties) - set(DIFFICULTIES))
    if bad:
        raise ValueError(f"unknown difficulties {bad}; choose from {list(DIFFICULTIES)}")
    if variants < 1:
        raise ValueError(f"variants={variants}: each domain needs at least one database; pass variants >= 1")
    db_dir = db_dir or str(cache_dir("sql_tasks"))
    splits: dict[str, list[dict]] = {"train": [], "test": []}
    for base in DOMAINS:
        for k in range(variants):
            db_id = base.db_id if k == 0 else f"{base.db_id}_{k + 1}"
            domain = styled_domain(base, draw_style(random.Random(f"style:{seed}:{db_id}")), db_id)
            tables = domain_rows(domain, seed)
            db_path = database_path(db_dir, domain, seed)
            if not os.path.exists(db_path):
                write_database(db_path, tables, domain.style)
            tasks = [
                t
                for t in domain_tasks(domain, db_path, tables, seed, scale)
                if t["difficulty"] in difficulties
            ]
            splits["test" if base.db_id in test_domains else "train"].extend(tasks)
    return DatasetDict({name: Dataset.from_list(rows) for name, rows in splits.items()})
