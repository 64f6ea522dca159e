"""Query families of the built-in task generator over one table: each draws one (question, gold SQL) pair.

A family returns None when the database offers nothing to ask in that form. Values are drawn from the data,
so filters select real rows, and an ORDER BY ... LIMIT or an arg-max is asked only where no tie makes its
answer ambiguous. Gold queries are written as annotators write them (``count(*)``, ``T1``/``T2`` aliases).
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import NamedTuple

from envs.sql.generator.datagen import TableData
from envs.sql.generator.domains import Column
from envs.sql.generator.wording import (
    ask_count,
    ask_list,
    ask_value,
    condition,
    like_condition,
    plural,
    sentence,
)

Tables = dict[str, TableData]
AGGREGATES = (("avg", "average"), ("min", "minimum"), ("max", "maximum"), ("sum", "total"))


class Candidate(NamedTuple):
    question: str
    sql: str
    difficulty: str


class Selection(NamedTuple):
    sql: str  # "T1.name, T1.city"
    words: str  # "names and cities"


def labelled(tables: Tables) -> list[TableData]:
    return [td for td in tables.values() if td.label is not None]


def selection(rng: random.Random, td: TableData, alias: str = "") -> Selection:
    """The label column, or the label and one more column ("the names and ages")."""
    label = td.label
    others = td.columns("cat", "int", "real")
    if others and rng.random() < 0.3:
        other = rng.choice(others)
        return Selection(
            f"{alias}{label.name}, {alias}{other.name}", f"{plural(label.phrase)} and {other.phrase}"
        )
    return Selection(f"{alias}{label.name}", rng.choice((label.phrase, plural(label.phrase))))


def unique_extreme(values: list, descending: bool, k: int) -> bool:
    """True when the top ``k`` of ``values`` (in that direction) are not tied with the next one."""
    ordered = sorted(values, reverse=descending)
    return len(ordered) > k and ordered[k - 1] != ordered[k]


def filter_family(rng: random.Random, tables: Tables) -> Candidate | None:
    td = rng.choice(labelled(tables))
    t = td.table
    form = rng.random()
    if form < 0.15:
        cat = rng.choice(td.columns("cat") or [td.label])
        what = f"the distinct {plural(cat.phrase)} of {t.plural}"
        if rng.random() < 0.5:
            what = rng.choice((f"all different {plural(cat.phrase)} of {t.plural}", what))
            return Candidate(ask_list(rng, what), f"SELECT DISTINCT {cat.name} FROM {t.name}", "easy")
        cond = condition(rng, td, avoid=cat)
        sql = f"SELECT DISTINCT {cat.name} FROM {t.name} WHERE {cond.sql}"
        return Candidate(ask_list(rng, f"{what} {cond.words}"), sql, "easy")
    picked = selection(rng, td)
    if form < 0.3:
        cond = like_condition(rng, td)
        if cond is None:
            return None
        sql = f"SELECT {picked.sql} FROM {t.name} WHERE {cond.sql}"
        return Candidate(ask_list(rng, f"the {picked.words} of {t.plural} {cond.words}"), sql, "easy")
    cond = condition(rng, td)
    where, words, difficulty = cond.sql, cond.words, "easy"
    if rng.random() < 0.3:
        second = condition(rng, td, avoid=cond.column)
        joiner = rng.choice(("AND", "OR"))
        where, words = f"{where} {joiner} {second.sql}", f"{words} {joiner.lower()} {second.words}"
        difficulty = "medium"
    sql = f"SELECT {picked.sql} FROM {t.name} WHERE {where}"
    return Candidate(ask_list(rng, f"the {picked.words} of {t.plural} {words}"), sql, difficulty)


def aggregate_family(rng: random.Random, tables: Tables) -> Candidate | None:
    td = rng.choice(list(tables.values()))
    t = td.table
    numbers = td.columns("int", "real")
    form = rng.random()
    cats = td.columns("cat")
    distinct = rng.choice(cats) if cats and 0.4 <= form < 0.5 else None
    cond = condition(rng, td, avoid=distinct) if rng.random() < 0.6 else None
    where = f" WHERE {cond.sql}" if cond else ""
    scope = f"{t.plural} {cond.words}" if cond else t.plural
    if form < 0.4 or not numbers:
        return Candidate(ask_count(rng, scope), f"SELECT count(*) FROM {t.name}{where}", "easy")
    if distinct is not None:
        cat = distinct
        question = rng.choice(
            (
                f"How many different {plural(cat.phrase)} do {scope} have?",
                f"Count the number of distinct {plural(cat.phrase)} of {scope}.",
            )
        )
        return Candidate(
            sentence(question), f"SELECT count(DISTINCT {cat.name}) FROM {t.name}{where}", "easy"
        )
    column = rng.choice(numbers)
    if form < 0.62:
        (f1, w1), (f2, w2) = rng.sample(AGGREGATES, 2)
        what = f"the {w1} and {w2} {column.phrase} of {scope}"
        sql = f"SELECT {f1}({column.name}), {f2}({column.name}) FROM {t.name}{where}"
        return Candidate(ask_value(rng, what), sql, "easy")
    func, word = rng.choice(AGGREGATES)
    what = rng.choice((f"the {word} {column.phrase} of {scope}", f"the {word} {column.phrase} among {scope}"))
    return Candidate(ask_value(rng, what), f"SELECT {func}({column.name}) FROM {t.name}{where}", "easy")


def _superlative(column: Column, descending: bool) -> str:
    return ("highest" if descending else "lowest") + f" {column.phrase}"


def order_limit_family(rng: random.Random, tables: Tables) -> Candidate | None:
    td = rng.choice(labelled(tables))
    t, label = td.table, td.label
    numbers = td.columns("int", "real")
    if not numbers:
        return None
    column, descending = rng.choice(numbers), rng.random() < 0.6
    direction = "DESC" if descending else "ASC"
    if rng.random() < 0.35:  # the whole list, sorted
        picked = selection(rng, td)
        order = (
            rng.choice(("descending", "decreasing"))
            if descending
            else rng.choice(("ascending", "increasing"))
        )
        what = f"the {picked.words} of all {t.plural}, sorted by {column.phrase} in {order} order"
        sql = f"SELECT {picked.sql} FROM {t.name} ORDER BY {column.name}" + (" DESC" if descending else "")
        return Candidate(ask_list(rng, what), sql, "easy")
    k = 1 if rng.random() < 0.6 else rng.randint(2, 5)
    if not unique_extreme(td.values(column), descending, k):
        return None
    sql = f"SELECT {label.name} FROM {t.name} ORDER BY {column.name} {direction} LIMIT {k}"
    if k == 1:
        most = _superlative(column, descending)
        question = rng.choice(
            (
                f"Which {t.singular} has the {most}? Give its {label.phrase}.",
                f"What is the {label.phrase} of the {t.singular} with the {most}?",
                f"Find the {label.phrase} of the {t.singular} that has the {most}.",
            )
        )
        return Candidate(question, sql, "easy")
    what = f"the {plural(label.phrase)} of the {k} {t.plural} with the {_superlative(column, descending)}"
    return Candidate(ask_list(rng, what), sql, "medium")


def _groups(td: TableData, column: Column) -> dict[object, list[tuple]]:
    groups: dict[object, list[tuple]] = defaultdict(list)
    for row in td.rows:
        groups[row[td.index(column)]].append(row)
    return groups


def group_having_family(rng: random.Random, tables: Tables) -> Candidate | None:
    candidates = [td for td in tables.values() if td.columns("cat")]
    if not candidates:
        return None
    td = rng.choice(candidates)
    t, group = td.table, rng.choice(td.columns("cat"))
    groups = _groups(td, group)
    numbers = td.columns("int", "real")
    form = rng.random()
    if form < 0.3:
        question = rng.choice(
            (
                f"How many {t.plural} are there for each {group.phrase}?",
                f"For each {group.phrase}, count the number of {t.plural}.",
                f"Show each {group.phrase} and the number of {t.plural} with it.",
            )
        )
        return Candidate(
            question, f"SELECT {group.name}, count(*) FROM {t.name} GROUP BY {group.name}", "medium"
        )
    if form < 0.5:
        descending = rng.random() < 0.7
        counts = [len(rows) for rows in groups.values()]
        if not unique_extreme(counts, descending, 1):
            return None
        most = "most" if descending else "fewest"
        question = rng.choice(
            (
                f"Which {group.phrase} has the {most} {t.plural}?",
                f"What is the {group.phrase} with the {most} {t.plural}?",
                f"Find the {group.phrase} that the {most} {t.plural} have.",
            )
        )
        sql = (
            f"SELECT {group.name} FROM {t.name} GROUP BY {group.name} "
            f"ORDER BY count(*) {'DESC' if descending else 'ASC'} LIMIT 1"
        )
        return Candidate(question, sql, "medium")
    if form < 0.7 or not numbers:
        k = len(rng.choice(list(groups.values()))) - 1
        op, words = rng.choice(((">", "more than"), (">=", "at least")))
        if op == ">=":
            k += 1
        what = f"the {plural(group.phrase)} that have {words} {k} {t.plural}"
        sql = f"SELECT {group.name} FROM {t.name} GROUP BY {group.name} HAVING count(*) {op} {k}"
        return Candidate(ask_list(rng, what), sql, "medium")
    column = rng.choice(numbers)
    func, word = rng.choice(AGGREGATES)
    if form < 0.85:
        what = f"each {group.phrase} and the {word} {column.phrase} of its {t.plural}"
        sql = f"SELECT {group.name}, {func}({column.name}) FROM {t.name} GROUP BY {group.name}"
        return Candidate(ask_list(rng, what), sql, "medium")
    values = [row[td.index(column)] for row in rng.choice(list(groups.values()))]
    stat = {"avg": sum(values) / len(values), "sum": sum(values), "max": max(values), "min": min(values)}[
        func
    ]
    threshold = int(stat) - 1
    what = f"the {plural(group.phrase)} whose {t.plural} have a {word} {column.phrase} above {threshold}"
    sql = (
        f"SELECT {group.name} FROM {t.name} GROUP BY {group.name} HAVING {func}({column.name}) > {threshold}"
    )
    return Candidate(ask_list(rng, what), sql, "medium")
