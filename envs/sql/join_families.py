"""Query families over several tables: joins of two and three tables, nested subqueries, set operations."""

from __future__ import annotations

import random

from envs.sql.datagen import TableData
from envs.sql.families import Candidate, Tables, condition, labelled


def _edges(tables: Tables) -> list[tuple[TableData, str, TableData]]:
    """Foreign keys as (child, fk column, parent)."""
    return [(td, c.name, tables[c.spec[0]]) for td in tables.values() for c in td.columns("fk")]


def join2_family(rng: random.Random, tables: Tables) -> Candidate:
    child, fk, parent = rng.choice(_edges(tables))
    c, p = child.table, parent.table
    on = f"FROM {p.name} AS T1 JOIN {c.name} AS T2 ON T2.{fk} = T1.id"
    form = rng.randrange(3 if child.label is not None else 2)
    if form == 0:
        where, words, _ = condition(rng, child, "T2.")
        question = rng.choice(
            (
                "List the distinct {lab} of {pp} that have at least one {cs} whose {cond}.",
                "Which {pp} have a {cs} whose {cond}? Give their {lab} without duplicates.",
            )
        ).format(lab=parent.label.phrase, pp=p.plural, cs=c.singular, cond=words)
        sql = f"SELECT DISTINCT T1.{parent.label.name} {on} WHERE {where}"
    elif form == 1:
        where, words, _ = condition(rng, parent, "T1.")
        question = rng.choice(
            (
                "How many {cp} belong to a {ps} whose {cond}?",
                "Count the {cp} of {pp} whose {cond}.",
            )
        ).format(cp=c.plural, ps=p.singular, pp=p.plural, cond=words)
        sql = f"SELECT COUNT(*) {on} WHERE {where}"
    else:
        where, words, _ = condition(rng, parent, "T1.")
        question = f"List the {child.label.phrase} of {c.plural} whose {p.singular}'s {words}."
        sql = f"SELECT T2.{child.label.name} {on} WHERE {where}"
    return Candidate(question, sql, "join2", "medium")


def join3_family(rng: random.Random, tables: Tables) -> Candidate | None:
    bridges = [td for td in tables.values() if len(td.columns("fk")) == 2]
    if not bridges:
        return None
    bridge = rng.choice(bridges)
    fk_a, fk_b = rng.sample(bridge.columns("fk"), 2)
    a, b = tables[fk_a.spec[0]], tables[fk_b.spec[0]]
    joins = (
        f"FROM {a.table.name} AS T1 JOIN {bridge.table.name} AS T2 ON T2.{fk_a.name} = T1.id "
        f"JOIN {b.table.name} AS T3 ON T2.{fk_b.name} = T3.id"
    )
    where_b, words_b, _ = condition(rng, b, "T3.")
    if rng.random() < 0.6:
        question = rng.choice(
            (
                "List the distinct {lab} of {ap} that have a {cs} involving a {bs} whose {cond}.",
                "Which {ap} are linked by a {cs} to a {bs} whose {cond}? Give their {lab} once each.",
            )
        ).format(
            lab=a.label.phrase, ap=a.table.plural, cs=bridge.table.singular, bs=b.table.singular, cond=words_b
        )
        return Candidate(
            question, f"SELECT DISTINCT T1.{a.label.name} {joins} WHERE {where_b}", "join3", "hard"
        )
    where_a, words_a, _ = condition(rng, a, "T1.")
    question = (
        f"How many {bridge.table.plural} involve both a {a.table.singular} whose {words_a} "
        f"and a {b.table.singular} whose {words_b}?"
    )
    return Candidate(question, f"SELECT COUNT(*) {joins} WHERE {where_a} AND {where_b}", "join3", "hard")


def nested_family(rng: random.Random, tables: Tables) -> Candidate | None:
    form = rng.randrange(3)
    numeric = [td for td in labelled(tables) if td.columns("int", "real")]
    if form == 0:
        td = rng.choice(numeric)
        t, lab = td.table, td.label
        column = rng.choice(td.columns("int", "real"))
        op, side = rng.choice(((">", "above"), ("<", "below")))
        question = rng.choice(
            (
                "List the {lab} of {plural} whose {phrase} is {side} the average.",
                "Which {plural} have a {phrase} {side} the average {phrase}? Give their {lab}.",
            )
        ).format(lab=lab.phrase, plural=t.plural, phrase=column.phrase, side=side)
        average = f"(SELECT AVG({column.name}) FROM {t.name})"
        sql = f"SELECT {lab.name} FROM {t.name} WHERE {column.name} {op} {average}"
        return Candidate(question, sql, "nested", "hard")
    if form == 1:
        child, fk, parent = rng.choice(_edges(tables))
        where, words, _ = condition(rng, child)
        question = rng.choice(
            (
                "List the {lab} of {pp} that have no {cs} whose {cond}.",
                "Which {pp} have no {cs} whose {cond}? Give their {lab}.",
            )
        ).format(lab=parent.label.phrase, pp=parent.table.plural, cs=child.table.singular, cond=words)
        sql = (
            f"SELECT {parent.label.name} FROM {parent.table.name} WHERE id NOT IN "
            f"(SELECT {fk} FROM {child.table.name} WHERE {where})"
        )
        return Candidate(question, sql, "nested", "hard")
    td = rng.choice(numeric)
    t, lab = td.table, td.label
    column = rng.choice(td.columns("int", "real"))
    where, words, _ = condition(rng, td, avoid=column)
    question = rng.choice(
        (
            "List the {lab} of {plural} whose {phrase} is higher than that of every {singular} whose {cond}.",
            "Which {plural} have a higher {phrase} than every {singular} whose {cond}? Give their {lab}.",
        )
    ).format(lab=lab.phrase, plural=t.plural, phrase=column.phrase, singular=t.singular, cond=words)
    sql = (
        f"SELECT {lab.name} FROM {t.name} WHERE {column.name} > "
        f"(SELECT MAX({column.name}) FROM {t.name} WHERE {where})"
    )
    return Candidate(question, sql, "nested", "hard")


def set_ops_family(rng: random.Random, tables: Tables) -> Candidate:
    td = rng.choice(labelled(tables))
    t, lab = td.table, td.label
    where1, words1, column1 = condition(rng, td)
    where2, words2, _ = condition(rng, td, avoid=column1)
    op, template = rng.choice(
        (
            ("UNION", "List the {lab} of {plural} whose {c1}, together with those whose {c2}."),
            ("UNION", "Give the {lab} of {plural} for which either the {c1} or the {c2}."),
            ("INTERSECT", "List the {lab} of {plural} whose {c1} and, at the same time, whose {c2}."),
            ("INTERSECT", "Give the {lab} of {plural} for which both the {c1} and the {c2}."),
            ("EXCEPT", "List the {lab} of {plural} whose {c1}, excluding those whose {c2}."),
            ("EXCEPT", "Among {plural} whose {c1}, leave out those whose {c2}; give the {lab} of the rest."),
        )
    )
    question = template.format(lab=lab.phrase, plural=t.plural, c1=words1, c2=words2)
    select = f"SELECT {lab.name} FROM {t.name} WHERE "
    return Candidate(question, f"{select}{where1} {op} {select}{where2}", "set_ops", "hard")
