"""The built-in text-to-SQL task generator: seeded databases, query families, a schema-disjoint split.

``domains`` holds the schemas, ``naming`` the naming styles each database is written in, ``datagen`` their
seeded rows, ``families`` and ``join_families`` the query families, ``wording`` the ways a question is
asked, and ``tasks`` the task set drawn from them (``generate_sql_tasks``, the ``env.tasks`` target of
``env=sql`` and ``env=sql_multiturn``).
"""

from envs.sql.generator.tasks import generate_sql_tasks

__all__ = ["generate_sql_tasks"]
