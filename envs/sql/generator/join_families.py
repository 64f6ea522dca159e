"""Query families over several tables: joins of two and three tables (with filters, counts, grouping and
arg-max), nested subqueries (IN, NOT IN, comparisons with an aggregate) and set operations.

Joins follow the foreign keys, whatever the schema's key names are (``T1.customer_id = T2.customer_id`` or
``T2.customer_id = T1.id``), the way Spider's annotators write them.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import NamedTuple

from envs.sql.generator.datagen import TableData
from envs.sql.generator.families import AGGREGATES, Candidate, Tables, labelled, selection, unique_extreme
from envs.sql.generator.naming import key_column
from envs.sql.generator.wording import (
    ask_count,
    ask_list,
    ask_value,
    condition,
    literal,
    plural,
    sentence,
    value_text,
)


class Edge(NamedTuple):
    """A foreign key: ``child.fk`` references ``parent.key``."""

    child: TableData
    fk: str
    parent: TableData
    key: str


def edges(tables: Tables) -> list[Edge]:
    return [
        Edge(td, c.name, tables[c.spec[0]], c.spec[1]) for td in tables.values() for c in td.columns("fk")
    ]


def _on(rng: random.Random, left: str, right: str) -> str:
    return f"{left} = {right}" if rng.random() < 0.5 else f"{right} = {left}"


def _join(rng: random.Random, e: Edge) -> str:
    """``FROM parent AS T1 JOIN child AS T2 ON ...``."""
    p, c = e.parent.table.name, e.child.table.name
    return f"FROM {p} AS T1 JOIN {c} AS T2 ON {_on(rng, f'T1.{e.key}', f'T2.{e.fk}')}"


def _child_counts(e: Edge) -> Counter:
    return Counter(e.child.values(next(c for c in e.child.table.columns if c.name == e.fk)))


def join2_family(rng: random.Random, tables: Tables) -> Candidate | None:
    e = rng.choice([e for e in edges(tables) if e.parent.label is not None])
    parent, child = e.parent, e.child
    p, c, label = parent.table, child.table, parent.label
    key = f"T1.{key_column(p).name}"
    form = rng.randrange(8)
    if form == 0:
        cond = condition(rng, child, "T2.")
        what = f"the distinct {plural(label.phrase)} of {p.plural} that have a {c.singular} {cond.words}"
        return Candidate(
            ask_list(rng, what), f"SELECT DISTINCT T1.{label.name} {_join(rng, e)} WHERE {cond.sql}", "medium"
        )
    if form == 1:
        cond = condition(rng, parent, "T1.")
        scope = f"{c.plural} of {p.plural} {cond.words}"
        return Candidate(ask_count(rng, scope), f"SELECT count(*) {_join(rng, e)} WHERE {cond.sql}", "medium")
    if form == 2:
        cond = condition(rng, parent, "T1.")
        if child.label is None:
            column = rng.choice(child.columns("cat", "int", "real"))
            what = (
                f"the {column.phrase} of each {c.singular} and the {label.phrase} of its {p.singular}, "
                f"for {p.plural} {cond.words}"
            )
            sql = f"SELECT T2.{column.name}, T1.{label.name} {_join(rng, e)} WHERE {cond.sql}"
            return Candidate(ask_list(rng, what), sql, "medium")
        picked = selection(rng, child, "T2.")
        link = rng.choice(("that belong to", "of", "for"))
        what = f"the {picked.words} of {c.plural} {link} {p.plural} {cond.words}"
        return Candidate(
            ask_list(rng, what), f"SELECT {picked.sql} {_join(rng, e)} WHERE {cond.sql}", "medium"
        )
    if form == 3:
        question = rng.choice(
            (
                f"For each {p.singular}, give its {label.phrase} and the number of {c.plural}.",
                f"Show the {label.phrase} of each {p.singular} and how many {c.plural} it has.",
                f"How many {c.plural} does each {p.singular} have? List the {label.phrase} and the count.",
            )
        )
        sql = f"SELECT T1.{label.name}, count(*) {_join(rng, e)} GROUP BY {key}"
        return Candidate(question, sql, "medium")
    if form == 4:
        if not unique_extreme(list(_child_counts(e).values()), True, 1):
            return None
        question = rng.choice(
            (
                f"Which {p.singular} has the most {c.plural}? Give its {label.phrase}.",
                f"What is the {label.phrase} of the {p.singular} with the largest number of {c.plural}?",
                f"Find the {label.phrase} of the {p.singular} that has the most {c.plural}.",
            )
        )
        sql = f"SELECT T1.{label.name} {_join(rng, e)} GROUP BY {key} ORDER BY count(*) DESC LIMIT 1"
        return Candidate(question, sql, "hard")
    if form == 5:
        k = rng.choice(sorted(set(_child_counts(e).values())))
        what = f"the {plural(label.phrase)} of {p.plural} that have at least {k} {c.plural}"
        sql = f"SELECT T1.{label.name} {_join(rng, e)} GROUP BY {key} HAVING count(*) >= {k}"
        return Candidate(ask_list(rng, what), sql, "hard")
    numbers = child.columns("int", "real")
    if not numbers:
        return None
    column = rng.choice(numbers)
    func, word = rng.choice(AGGREGATES)
    if form == 6:
        cond = condition(rng, parent, "T1.")
        what = f"the {word} {column.phrase} of {c.plural} of {p.plural} {cond.words}"
        sql = f"SELECT {func}(T2.{column.name}) {_join(rng, e)} WHERE {cond.sql}"
        return Candidate(ask_value(rng, what), sql, "medium")
    what = f"the {label.phrase} of each {p.singular} and the {word} {column.phrase} of its {c.plural}"
    sql = f"SELECT T1.{label.name}, {func}(T2.{column.name}) {_join(rng, e)} GROUP BY {key}"
    return Candidate(ask_list(rng, what), sql, "hard")


class Path(NamedTuple):
    """Three tables linked by two foreign keys: T1 - T2 - T3, with the join text."""

    first: TableData
    middle: TableData
    last: TableData
    joins: str


def _paths(rng: random.Random, tables: Tables) -> list[Path]:
    """Every chain of two foreign keys (a linking table, or a child of a child), as T1 - T2 - T3."""
    paths = []
    all_edges = edges(tables)
    for a in all_edges:
        for b in all_edges:
            if a == b:
                continue
            ends = []
            if a.child is b.child:  # a linking table: T1 = a.parent, T2 = child, T3 = b.parent
                ends = [(a.parent, a.key, a.fk, a.child, b.fk, b.key, b.parent)]
            elif a.parent is b.child:  # a chain a.child -> a.parent (= b.child) -> b.parent, both ways
                ends = [
                    (a.child, a.fk, a.key, a.parent, b.fk, b.key, b.parent),
                    (b.parent, b.key, b.fk, a.parent, a.key, a.fk, a.child),
                ]
            for first, first_col, mid_col1, middle, mid_col2, last_col, last in ends:
                if first is last:
                    continue
                joins = (
                    f"FROM {first.table.name} AS T1 JOIN {middle.table.name} AS T2 ON "
                    f"{_on(rng, f'T1.{first_col}', f'T2.{mid_col1}')} JOIN {last.table.name} AS T3 ON "
                    f"{_on(rng, f'T2.{mid_col2}', f'T3.{last_col}')}"
                )
                paths.append(Path(first, middle, last, joins))
    return paths


def _label_equals(rng: random.Random, td: TableData, alias: str):
    """``T3.name = 'X'`` with a label value drawn from the data, and its wording ("the product X")."""
    value = rng.choice(td.values(td.label))
    words = rng.choice((f"the {td.table.singular} {value_text(rng, value)}", f"{value_text(rng, value)}"))
    return f"{alias}{td.label.name} = {literal(value)}", words


def join3_family(rng: random.Random, tables: Tables) -> Candidate | None:
    paths = [p for p in _paths(rng, tables) if p.first.label is not None]
    if not paths:
        return None
    path = rng.choice(paths)
    first, middle, last = path.first, path.middle, path.last
    a, m, b = first.table, middle.table, last.table
    label = first.label
    labels = plural(label.phrase)
    form = rng.randrange(4)
    if form == 0 and last.label is not None:
        where, words = _label_equals(rng, last, "T3.")
        what = rng.choice(
            (
                f"the distinct {labels} of {a.plural} related to {words} through their {m.plural}",
                f"the distinct {labels} of {a.plural} that have a {m.singular} involving {words}",
            )
        )
        return Candidate(
            ask_list(rng, what), f"SELECT DISTINCT T1.{label.name} {path.joins} WHERE {where}", "hard"
        )
    if form <= 1:
        cond = condition(rng, last, "T3.")
        what = f"the distinct {labels} of {a.plural} with a {m.singular} linked to {b.plural} {cond.words}"
        return Candidate(
            ask_list(rng, what), f"SELECT DISTINCT T1.{label.name} {path.joins} WHERE {cond.sql}", "hard"
        )
    if form == 2:
        first_cond, last_cond = condition(rng, first, "T1."), condition(rng, last, "T3.")
        question = sentence(
            f"How many {m.plural} link {a.plural} {first_cond.words} to {b.plural} {last_cond.words}?"
        )
        return Candidate(
            question, f"SELECT count(*) {path.joins} WHERE {first_cond.sql} AND {last_cond.sql}", "hard"
        )
    if last.label is None:
        return None
    cond = condition(rng, middle, "T2.")
    what = (
        f"the {label.phrase} of each {a.singular} and the {last.label.phrase} of the {b.singular}, "
        f"for {m.plural} {cond.words}"
    )
    sql = f"SELECT T1.{label.name}, T3.{last.label.name} {path.joins} WHERE {cond.sql}"
    return Candidate(ask_list(rng, what), sql, "hard")


def nested_family(rng: random.Random, tables: Tables) -> Candidate | None:
    form = rng.randrange(5)
    if form == 0:
        numeric = [td for td in labelled(tables) if td.columns("int", "real")]
        td = rng.choice(numeric)
        t, label = td.table, td.label
        column = rng.choice(td.columns("int", "real"))
        op, side = rng.choice(((">", "above"), ("<", "below"), (">", "higher than"), ("<", "lower than")))
        what = f"the {plural(label.phrase)} of {t.plural} whose {column.phrase} is {side} the average"
        average = f"(SELECT avg({column.name}) FROM {t.name})"
        sql = f"SELECT {label.name} FROM {t.name} WHERE {column.name} {op} {average}"
        return Candidate(ask_list(rng, what), sql, "hard")
    e = rng.choice([e for e in edges(tables) if e.parent.label is not None])
    p, c, label = e.parent.table, e.child.table, e.parent.label
    key = key_column(p).name
    if form == 1:
        question = rng.choice(
            (
                f"Which {p.plural} have no {c.plural}? Give their {plural(label.phrase)}.",
                f"List the {plural(label.phrase)} of {p.plural} that do not have any {c.singular}.",
                f"Find the {label.phrase} of every {p.singular} without {c.plural}.",
            )
        )
        sql = f"SELECT {label.name} FROM {p.name} WHERE {key} NOT IN (SELECT {e.fk} FROM {c.name})"
        return Candidate(question, sql, "hard")
    if form == 2:
        question = sentence(
            rng.choice(
                (
                    f"How many {p.plural} have no {c.plural}?",
                    f"Count the {p.plural} that do not have any {c.singular}.",
                )
            )
        )
        sql = f"SELECT count(*) FROM {p.name} WHERE {key} NOT IN (SELECT {e.fk} FROM {c.name})"
        return Candidate(question, sql, "hard")
    cond = condition(rng, e.child)
    if form == 3:
        what = f"the {plural(label.phrase)} of {p.plural} that have a {c.singular} {cond.words}"
        sql = (
            f"SELECT {label.name} FROM {p.name} WHERE {key} IN (SELECT {e.fk} FROM {c.name} WHERE {cond.sql})"
        )
        return Candidate(ask_list(rng, what), sql, "hard")
    what = f"the {plural(label.phrase)} of {p.plural} that have no {c.singular} {cond.words}"
    sql = (
        f"SELECT {label.name} FROM {p.name} WHERE {key} NOT IN (SELECT {e.fk} FROM {c.name} WHERE {cond.sql})"
    )
    return Candidate(ask_list(rng, what), sql, "hard")


def set_ops_family(rng: random.Random, tables: Tables) -> Candidate | None:
    if rng.random() < 0.5:
        td = rng.choice(labelled(tables))
        t, label = td.table, td.label
        first = condition(rng, td)
        second = condition(rng, td, avoid=first.column)
        op, template = rng.choice(
            (
                ("UNION", "the {lab} of {plural} {c1} or {c2}"),
                ("INTERSECT", "the {lab} of {plural} that are both {c1} and {c2}"),
                ("EXCEPT", "the {lab} of {plural} {c1}, except those {c2}"),
            )
        )
        what = template.format(lab=plural(label.phrase), plural=t.plural, c1=first.words, c2=second.words)
        select = f"SELECT {label.name} FROM {t.name} WHERE "
        return Candidate(ask_list(rng, what), f"{select}{first.sql} {op} {select}{second.sql}", "hard")
    e = rng.choice([e for e in edges(tables) if e.parent.label is not None])
    p, c, label = e.parent.table, e.child.table, e.parent.label
    first = condition(rng, e.child, "T2.")
    select = f"SELECT T1.{label.name} {_join(rng, e)} WHERE "
    if rng.random() < 0.5:
        second = condition(rng, e.child, "T2.", avoid=first.column)
        what = (
            f"the {plural(label.phrase)} of {p.plural} that have both a {c.singular} {first.words} "
            f"and a {c.singular} {second.words}"
        )
        return Candidate(ask_list(rng, what), f"{select}{first.sql} INTERSECT {select}{second.sql}", "hard")
    what = f"the {plural(label.phrase)} of {p.plural} that have no {c.singular} {first.words}"
    sql = f"SELECT {label.name} FROM {p.name} EXCEPT {select}{first.sql}"
    return Candidate(ask_list(rng, what), sql, "hard")
