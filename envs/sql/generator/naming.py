"""Naming styles for the generated databases, drawn per database, as real schemas vary.

A domain is written with snake_case names and ``id`` keys. A style renames it the way real databases are
named: tables singular or plural, snake_case, Title_Snake or CamelCase, keys ``id`` or ``<entity>_id``
(a foreign key then has the name of the key it references, so joins read ``T1.customer_id = T2.customer_id``),
label columns ``name`` or ``<entity>_name``, and the CREATE TABLE text in one of several dialects. The
questions keep the domain's plain-English phrases, so the model must map words to whatever the names are.
"""

from __future__ import annotations

import random
import sqlite3
from dataclasses import replace

from envs.sql.generator.domains import Column, Domain, SchemaStyle, Table

CASES = ("snake", "title", "camel")
KEYS = ("id", "entity_id")
TYPE_DIALECTS = ("affinity", "sized")


def draw_style(rng: random.Random) -> SchemaStyle:
    """A random style; every field independent."""
    return SchemaStyle(
        case=rng.choice(CASES),
        singular_tables=rng.random() < 0.5,
        key=rng.choice(KEYS),
        prefixed_labels=rng.random() < 0.4,
        types=rng.choice(TYPE_DIALECTS),
        inline_fks=rng.random() < 0.3,
        quoted=rng.random() < 0.25,
    )


def _cased(snake: str, case: str) -> str:
    words = snake.split("_")
    if case == "title":
        return "_".join("ID" if w == "id" else w.capitalize() for w in words)
    if case == "camel":
        return "".join("ID" if w == "id" else w.capitalize() for w in words)
    return snake


def _is_keyword(name: str) -> bool:
    try:
        sqlite3.connect(":memory:").execute(f"CREATE TABLE {name} ({name} INTEGER)")
    except sqlite3.OperationalError:
        return True
    return False


def _name(snake: str, case: str, fallback: str) -> str:
    """``snake`` in ``case``, or ``fallback`` in ``case`` when the first is an SQL keyword (``order``)."""
    name = _cased(snake, case)
    return _cased(fallback, case) if _is_keyword(name) else name


def _key_name(table: Table, style: SchemaStyle) -> str:
    singular = table.singular.replace(" ", "_")
    return _cased("id" if style.key == "id" else f"{singular}_id", style.case)


def styled_domain(domain: Domain, style: SchemaStyle, db_id: str | None = None) -> Domain:
    """``domain`` renamed by ``style`` (foreign keys follow their tables' new names)."""
    table_names = {
        t.name: _name(t.singular.replace(" ", "_") if style.singular_tables else t.name, style.case, t.name)
        for t in domain.tables
    }
    keys = {t.name: _key_name(t, style) for t in domain.tables}
    tables = []
    for table in domain.tables:
        columns = []
        for column in table.columns:
            if column.kind == "key":
                name = keys[table.name]
            elif column.kind == "fk":
                parent = column.spec[0]
                default = f"{next(t.singular for t in domain.tables if t.name == parent)}_id".replace(
                    " ", "_"
                )
                name = keys[parent] if style.key != "id" else _cased(default, style.case)
                column = replace(column, spec=(table_names[parent], keys[parent]))
            elif column.kind == "label" and style.prefixed_labels:
                name = _name(f"{table.singular.replace(' ', '_')}_{column.name}", style.case, column.name)
            else:
                name = _name(column.name, style.case, f"{table.singular}_{column.name}".replace(" ", "_"))
            columns.append(replace(column, name=name))
        tables.append(replace(table, name=table_names[table.name], columns=tuple(columns)))
    return Domain(db_id or domain.db_id, tuple(tables), style)


def key_column(table: Table) -> Column:
    return next(c for c in table.columns if c.kind == "key")
