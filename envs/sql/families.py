"""Query families of the built-in task generator: each draws one (question, gold SQL) pair for a database.

A family returns None when the database offers nothing to ask in that form. Questions come from several
templates per family so the wording varies; values are drawn from the data so filters select real rows.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import NamedTuple

from envs.sql.datagen import TableData
from envs.sql.domains import Column

Tables = dict[str, TableData]
_OPS = ((">", "greater than"), ("<", "less than"), (">=", "at least"), ("<=", "at most"))
_AGGS = (("AVG", "average"), ("MIN", "minimum"), ("MAX", "maximum"), ("SUM", "total"))


class Candidate(NamedTuple):
    question: str
    sql: str
    family: str
    difficulty: str


def literal(value) -> str:
    return "'" + value.replace("'", "''") + "'" if isinstance(value, str) else repr(value)


class Condition(NamedTuple):
    sql: str
    words: str
    column: Column


def condition(rng: random.Random, td: TableData, alias: str = "", avoid: Column | None = None) -> Condition:
    """A WHERE predicate on a category or number column other than ``avoid``, and its wording."""
    columns = [c for c in td.columns("cat", "int", "real") if c != avoid] or td.columns("cat", "int", "real")
    column = rng.choice(columns)
    value = rng.choice(td.values(column))
    if column.kind == "cat":
        return Condition(f"{alias}{column.name} = {literal(value)}", f"{column.phrase} is '{value}'", column)
    op, words = rng.choice(_OPS)
    return Condition(f"{alias}{column.name} {op} {value!r}", f"{column.phrase} is {words} {value}", column)


def labelled(tables: Tables) -> list[TableData]:
    return [td for td in tables.values() if td.label is not None]


def filter_family(rng: random.Random, tables: Tables) -> Candidate:
    td = rng.choice(labelled(tables))
    t, lab = td.table, td.label
    where, words, column = condition(rng, td)
    difficulty = "easy"
    if rng.random() < 0.3:
        where2, words2, _ = condition(rng, td, avoid=column)
        joiner = rng.choice(("AND", "OR"))
        where, words = f"{where} {joiner} {where2}", f"{words} {joiner.lower()} whose {words2}"
        difficulty = "medium"
    question = rng.choice(
        (
            "List the {lab} of all {plural} whose {cond}.",
            "Give the {lab} of each {singular} for which the {cond}.",
            "Show the {lab} of every {singular} whose {cond}.",
            "Find the {lab} of {plural} whose {cond}.",
        )
    ).format(lab=lab.phrase, plural=t.plural, singular=t.singular, cond=words)
    return Candidate(question, f"SELECT {lab.name} FROM {t.name} WHERE {where}", "filter", difficulty)


def aggregate_family(rng: random.Random, tables: Tables) -> Candidate:
    td = rng.choice(list(tables.values()))
    t = td.table
    numbers = td.columns("int", "real")
    column = rng.choice(numbers) if numbers else None
    where, words, _ = condition(rng, td, avoid=column) if rng.random() < 0.75 else ("", "", None)
    sql_where, cond = (f" WHERE {where}", f" whose {words}") if where else ("", "")
    if rng.random() < 0.45 or column is None:
        question = rng.choice(
            (
                "How many {plural} are there{cond}?",
                "Count the {plural}{cond}.",
                "What is the number of {plural}{cond}?",
            )
        )
        question = question.format(plural=t.plural, cond=cond)
        return Candidate(question, f"SELECT COUNT(*) FROM {t.name}{sql_where}", "aggregate", "easy")
    func, word = rng.choice(_AGGS)
    question = rng.choice(
        (
            "What is the {word} {phrase} of {plural}{cond}?",
            "Find the {word} {phrase} among {plural}{cond}.",
            "Compute the {word} {phrase} over all {plural}{cond}.",
        )
    )
    question = question.format(word=word, phrase=column.phrase, plural=t.plural, cond=cond)
    return Candidate(question, f"SELECT {func}({column.name}) FROM {t.name}{sql_where}", "aggregate", "easy")


def order_limit_family(rng: random.Random, tables: Tables) -> Candidate | None:
    td = rng.choice(labelled(tables))
    t, lab = td.table, td.label
    # Only columns without ties give a unique answer under ORDER BY ... LIMIT.
    unique = [c for c in td.columns("int", "real") if len(set(td.values(c))) == len(td.rows)]
    if not unique:
        return None
    column, k = rng.choice(unique), rng.randint(1, 5)
    direction, extreme = rng.choice((("DESC", "highest"), ("ASC", "lowest")))
    where, words, _ = condition(rng, td, avoid=column) if rng.random() < 0.35 else ("", "", None)
    sql = f"SELECT {lab.name} FROM {t.name}" + (f" WHERE {where}" if where else "")
    sql += f" ORDER BY {column.name} {direction} LIMIT {k}"
    scope = f"Among {t.plural} whose {words}, " if where else ""
    if k == 1:
        question = scope + f"which {t.singular} has the {extreme} {column.phrase}? Give its {lab.phrase}."
    else:
        question = scope + rng.choice(
            (
                "list the {lab} of the {k} {plural} with the {ext} {phrase}.",
                "what are the {lab}s of the {k} {plural} with the {ext} {phrase}?",
            )
        )
        question = question.format(lab=lab.phrase, k=k, plural=t.plural, ext=extreme, phrase=column.phrase)
        question += f" Sort them by {column.phrase}, {extreme} first."
    question = question[0].upper() + question[1:]
    return Candidate(question, sql, "order_limit", "medium" if where else "easy")


def group_having_family(rng: random.Random, tables: Tables) -> Candidate | None:
    candidates = [td for td in tables.values() if td.columns("cat")]
    td = rng.choice(candidates)
    t, group = td.table, rng.choice(td.columns("cat"))
    groups: dict[object, list[tuple]] = defaultdict(list)
    for row in td.rows:
        groups[row[td.index(group)]].append(row)
    numbers = td.columns("int", "real")
    if rng.random() < 0.5 or not numbers:
        k = len(rng.choice(list(groups.values()))) - 1
        question = rng.choice(
            (
                "For each {g}, how many {plural} are there? Only show those with more than {k} {plural}.",
                "Which {g} values have more than {k} {plural}? Give each {g} and its number of {plural}.",
            )
        ).format(g=group.phrase, plural=t.plural, k=k)
        sql = f"SELECT {group.name}, COUNT(*) FROM {t.name} GROUP BY {group.name} HAVING COUNT(*) > {k}"
        return Candidate(question, sql, "group_having", "medium")
    column = rng.choice(numbers)
    func, word = rng.choice((("AVG", "average"), ("SUM", "total"), ("MAX", "maximum")))
    rows = rng.choice(list(groups.values()))
    values = [row[td.index(column)] for row in rows]
    stat = {"AVG": sum(values) / len(values), "SUM": sum(values), "MAX": max(values)}[func]
    threshold = int(stat) - 1
    question = rng.choice(
        (
            "Which {g} values have an {w} {phrase} above {x} across their {plural}?",
            "List each {g} whose {plural} have an {w} {phrase} greater than {x}.",
        )
    ).format(g=group.phrase, w=word, phrase=column.phrase, x=threshold, plural=t.plural)
    question = question.replace("an total", "a total").replace("an maximum", "a maximum")
    sql = (
        f"SELECT {group.name} FROM {t.name} GROUP BY {group.name} HAVING {func}({column.name}) > {threshold}"
    )
    return Candidate(question, sql, "group_having", "medium")
