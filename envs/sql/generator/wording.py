"""Ways to word a question, as people ask them: several openers per intent, conditions and values phrased in
more than one way, values quoted or not.
"""

from __future__ import annotations

import random
import re
from typing import NamedTuple

from envs.sql.generator.datagen import TableData
from envs.sql.generator.domains import Column

_LIST_OPENERS = (
    "What are {x}?",
    "Show {x}.",
    "List {x}.",
    "Find {x}.",
    "Give me {x}.",
    "Return {x}.",
    "Tell me {x}.",
    "I want to know {x}.",
)
_VALUE_OPENERS = ("What is {x}?", "Find {x}.", "Give me {x}.", "Return {x}.", "Tell me {x}.", "Compute {x}.")
_COUNT_OPENERS = (
    "How many {x} are there?",
    "Count the number of {x}.",
    "What is the number of {x}?",
    "Find the number of {x}.",
    "Give me the count of {x}.",
    "How many {x} do we have?",
)
_OPS = {
    ">": ("greater than", "more than", "above", "over", "larger than"),
    "<": ("less than", "below", "under", "smaller than", "lower than"),
    ">=": ("at least", "no less than", "greater than or equal to"),
    "<=": ("at most", "no more than", "less than or equal to"),
}


def sentence(text: str) -> str:
    """Capitalise the first letter and turn "a apple" into "an apple"."""
    text = re.sub(r"\ba ([aeiouAEIOU])", r"an \1", text)
    return text[0].upper() + text[1:]


def ask_list(rng: random.Random, what: str) -> str:
    """A request for a list: ``what`` is a noun phrase such as "the names of customers in Boston"."""
    return sentence(rng.choice(_LIST_OPENERS).format(x=what))


def ask_value(rng: random.Random, what: str) -> str:
    return sentence(rng.choice(_VALUE_OPENERS).format(x=what))


def ask_count(rng: random.Random, plural_phrase: str) -> str:
    return sentence(rng.choice(_COUNT_OPENERS).format(x=plural_phrase))


def plural(word: str) -> str:
    if re.search(r"[^aeiou]y$", word):
        return word[:-1] + "ies"
    if re.search(r"(s|x|ch|sh)$", word):
        return word + "es"
    return word + "s"


def value_text(rng: random.Random, value) -> str:
    """A value as a question names it: strings quoted in half the questions, as real questions do."""
    if isinstance(value, str) and rng.random() < 0.5:
        return rng.choice(("'{}'", '"{}"')).format(value)
    return str(value)


def literal(value) -> str:
    return "'" + value.replace("'", "''") + "'" if isinstance(value, str) else repr(value)


class Condition(NamedTuple):
    sql: str  # a predicate, e.g. "T1.city = 'Boston'"
    words: str  # a clause that follows a plural noun, e.g. "whose city is Boston"
    column: Column


def _category_words(rng: random.Random, phrase: str, value: str, negated: bool) -> str:
    shown = value_text(rng, value)
    if negated:
        return rng.choice((f"whose {phrase} is not {shown}", f"with a {phrase} other than {shown}"))
    return rng.choice(
        (
            f"whose {phrase} is {shown}",
            f"with {phrase} {shown}",
            f"that have {phrase} {shown}",
            f"with the {phrase} {shown}",
        )
    )


def condition(rng: random.Random, td: TableData, alias: str = "", avoid: Column | None = None) -> Condition:
    """A WHERE predicate on a category or number column other than ``avoid``, and its wording; values are
    drawn from the data, so the predicate selects real rows."""
    columns = [c for c in td.columns("cat", "int", "real") if c != avoid] or td.columns("cat", "int", "real")
    column = rng.choice(columns)
    values = td.values(column)
    value = rng.choice(values)
    name = f"{alias}{column.name}"
    if column.kind == "cat":
        negated = rng.random() < 0.12
        op = "!=" if negated else "="
        return Condition(
            f"{name} {op} {literal(value)}", _category_words(rng, column.phrase, value, negated), column
        )
    if rng.random() < 0.12:
        low, high = sorted(rng.sample(sorted(set(values)), 2)) if len(set(values)) > 1 else (value, value)
        return Condition(
            f"{name} BETWEEN {low!r} AND {high!r}",
            f"whose {column.phrase} is between {low} and {high}",
            column,
        )
    op = rng.choice(tuple(_OPS))
    words = rng.choice((f"whose {column.phrase} is {{}} {value}", f"with a {column.phrase} {{}} {value}"))
    return Condition(f"{name} {op} {value!r}", words.format(rng.choice(_OPS[op])), column)


def like_condition(rng: random.Random, td: TableData, alias: str = "") -> Condition | None:
    """``label LIKE '%word%'`` on one word of a label value ("whose name contains 'Lake'")."""
    label = td.label
    if label is None:
        return None
    word = rng.choice(str(rng.choice(td.values(label))).split())
    if len(word) < 3 or "'" in word:
        return None
    words = rng.choice(
        (
            f"whose {label.phrase} contains {value_text(rng, word)}",
            f"with {value_text(rng, word)} in their {label.phrase}",
            f"whose {label.phrase} includes the word {value_text(rng, word)}",
        )
    )
    return Condition(f"{alias}{label.name} LIKE '%{word}%'", words, label)
