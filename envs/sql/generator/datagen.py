"""Seeded data for the built-in domains, written once to SQLite files and reused."""

from __future__ import annotations

import itertools
import os
import random
import sqlite3
from dataclasses import dataclass, field

from envs.sql.generator.domains import Column, Domain, SchemaStyle, Table

# Column kind -> its declared type in each dialect of ``SchemaStyle.types``.
_SQL_TYPES = {
    "affinity": {
        "key": "INTEGER PRIMARY KEY",
        "label": "TEXT NOT NULL",
        "cat": "TEXT",
        "int": "INTEGER",
        "real": "REAL",
        "fk": "INTEGER",
    },
    "sized": {
        "key": "int PRIMARY KEY",
        "label": "varchar(80) NOT NULL",
        "cat": "varchar(40)",
        "int": "int",
        "real": "real",
        "fk": "int",
    },
}


@dataclass(slots=True)
class TableData:
    """A table's spec and its rows (tuples in column order)."""

    table: Table
    rows: list[tuple]
    positions: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.positions = {c.name: i for i, c in enumerate(self.table.columns)}

    def index(self, column: Column) -> int:
        return self.positions[column.name]

    def values(self, column: Column) -> list:
        i = self.index(column)
        return [row[i] for row in self.rows]

    def columns(self, *kinds: str) -> list[Column]:
        return [c for c in self.table.columns if c.kind in kinds]

    @property
    def label(self) -> Column | None:
        labels = self.columns("label")
        return labels[0] if labels else None


def _labels(rng: random.Random, table: Table, column: Column) -> list[str]:
    combos = [" ".join(parts) for parts in itertools.product(*column.spec)]
    if len(combos) < table.num_rows:
        raise ValueError(
            f"{table.name}.{column.name}: {len(combos)} distinct labels for {table.num_rows} rows"
        )
    rng.shuffle(combos)
    return combos[: table.num_rows]


def _value(rng: random.Random, column: Column, sizes: dict[str, int]):
    if column.kind == "cat":
        return rng.choice(column.spec)
    if column.kind == "int":
        return rng.randint(*column.spec)
    if column.kind == "real":
        return round(rng.uniform(*column.spec), 2)
    return rng.randint(1, sizes[column.spec[0]])


def domain_rows(domain: Domain, seed: int) -> dict[str, TableData]:
    """Every table's rows, deterministic for ``seed``."""
    rng = random.Random(f"{seed}:{domain.db_id}")
    sizes = {t.name: t.num_rows for t in domain.tables}
    data = {}
    for table in domain.tables:
        labels = {c.name: _labels(rng, table, c) for c in table.columns if c.kind == "label"}
        rows = []
        for i in range(table.num_rows):
            row = []
            for column in table.columns:
                if column.kind == "key":
                    row.append(i + 1)
                elif column.kind == "label":
                    row.append(labels[column.name][i])
                else:
                    row.append(_value(rng, column, sizes))
            rows.append(tuple(row))
        data[table.name] = TableData(table, rows)
    return data


def create_table_sql(table: Table, style: SchemaStyle) -> str:
    """The CREATE TABLE statement of a table spec, foreign keys included, written in ``style``'s dialect."""

    def name(identifier: str) -> str:
        return f'"{identifier}"' if style.quoted else identifier

    types = _SQL_TYPES[style.types]
    lines = []
    for c in table.columns:
        line = f"  {name(c.name)} {types[c.kind]}"
        if c.kind == "fk" and style.inline_fks:
            line += f" REFERENCES {name(c.spec[0])}({name(c.spec[1])})"
        lines.append(line)
    if not style.inline_fks:
        lines += [
            f"  FOREIGN KEY ({name(c.name)}) REFERENCES {name(c.spec[0])}({name(c.spec[1])})"
            for c in table.columns
            if c.kind == "fk"
        ]
    return f"CREATE TABLE {name(table.name)} (\n" + ",\n".join(lines) + "\n)"


def write_database(path: str, data: dict[str, TableData], style: SchemaStyle) -> None:
    """Write the tables to ``path`` atomically (build a temporary file, then rename it into place)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    if os.path.exists(tmp):
        os.remove(tmp)
    conn = sqlite3.connect(tmp)
    try:
        for table_data in data.values():
            table = table_data.table
            conn.execute(create_table_sql(table, style))
            marks = ", ".join("?" * len(table.columns))
            conn.executemany(f'INSERT INTO "{table.name}" VALUES ({marks})', table_data.rows)
        conn.commit()
    finally:
        conn.close()
    os.replace(tmp, path)
