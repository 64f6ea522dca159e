"""The plugin envs the run tests train and evaluate on, each registered as a module importable by dotted path,
as a user's plugin package would be: vowels (e2e_vowel_env), and parity with its transfer task sources
(e2e_transfer_env); and the overrides that select them."""

import os
import sqlite3
import sys
import types

from datasets import Dataset, DatasetDict

from envs import BaseEnv, StepResult


def plugin_module(name: str, *members) -> types.ModuleType:
    """A module importable by dotted path, as a user's plugin package would be, holding `members` under their
    own names."""
    module = types.ModuleType(name)
    for member in members:
        setattr(module, member.__name__, member)
    sys.modules[name] = module
    return module


class VowelEnv(BaseEnv):
    """A plugin env whose reward (the share of vowels in the answer) varies even for a random model, so
    group-relative advantages are nonzero and the adapter must learn."""

    max_turns = 1

    def start(self, task):
        return VowelEpisode(task)


class VowelEpisode:
    max_turns = 1

    def __init__(self, task):
        self.task = task
        self.messages = [{"role": "user", "content": task["question"]}]

    def step(self, action):
        share = sum(c in "aeiou" for c in action) / max(len(action), 1)
        return StepResult(None, share, True, rewards={"vowels": share})


def numbered_tasks(fields=lambda i: {}):
    """40 questions about the numbers 0-39, each row with `fields(i)` too: 32 to train on, 8 held out."""
    rows = [{"question": f"Say something about the number {i}.", **fields(i)} for i in range(40)]
    return DatasetDict(train=Dataset.from_list(rows[:32]), test=Dataset.from_list(rows[32:]))


def vowel_tasks():
    return numbered_tasks()


def plugin_overrides(module: types.ModuleType, env: type, tasks) -> list[str]:
    """The overrides that train on `env` with `tasks` from the plugin module `module`."""
    name = module.__name__
    return ["env=plugin", f"env.name={name}.{env.__name__}", f"env.tasks._target_={name}.{tasks.__name__}"]


VOWEL_PLUGIN = plugin_module("e2e_vowel_env", VowelEnv, vowel_tasks)
VOWELS = plugin_overrides(VOWEL_PLUGIN, VowelEnv, vowel_tasks)
FAMILIES, DATABASES = ("filter", "join"), ("pets", "concert", "shop")


class ParityEnv(BaseEnv):
    """A plugin env whose success is a parity of the question and the reply, so it splits the tasks roughly
    in half even for a tiny random model that writes the same reply to every prompt, and accuracies computed
    two ways can disagree; its reward adds a bonus for length, so success is its own `is_success` (the
    `won` component). It also demonstrates, so the warm start runs."""

    max_turns = 1

    def start(self, task):
        return ParityEpisode(task)

    def demonstration(self, task):
        return "even"

    def is_success(self, episode):
        return episode.rewards.get("won", 0.0) == 1.0


class ParityEpisode:
    max_turns = 1

    def __init__(self, task):
        self.question = task["question"]
        self.messages = [{"role": "user", "content": self.question}]

    def step(self, action):
        won = float((len(action) + sum(map(ord, self.question))) % 2 == 0)
        return StepResult(None, won + 0.01 * len(action), True, rewards={"won": won})


def parity_tasks():
    rows = [{"question": f"Describe the number {i} in a few words."} for i in range(40)]
    return DatasetDict(train=Dataset.from_list(rows[:32]), test=Dataset.from_list(rows[32:]))


def other_tasks(num_test: int = 16):
    """Another source: other questions, with the labels a transfer table breaks accuracy down by."""
    rows = [
        {"question": f"Tell me a fact about item {i}.", "family": FAMILIES[i % 2], "db_id": DATABASES[i % 3]}
        for i in range(num_test + 2)
    ]
    return DatasetDict(train=Dataset.from_list(rows[:2]), test=Dataset.from_list(rows[2:]))


def write_shop_db(path) -> str:
    if os.path.exists(path):  # the task source runs once per run: the database is written once
        return str(path)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT, price REAL)")
    rows = [(1, "pen", 1.5), (2, "ink", 4.0), (3, "pad", 2.25)]
    conn.executemany("INSERT INTO item VALUES (?, ?, ?)", rows)
    conn.commit()
    conn.close()
    return str(path)


def sql_tasks(db_dir: str, missing_db: bool = False):
    """Real-looking SQL tasks over a fixture database (the test split is what a transfer set scores)."""
    db_path = write_shop_db(f"{db_dir}/shop.sqlite")
    queries = [
        ("How many items are there?", "SELECT count(*) FROM item", "aggregate"),
        ("List the names of all items.", "SELECT name FROM item", "filter"),
        ("Which item costs most?", "SELECT name FROM item ORDER BY price DESC LIMIT 1", "order_limit"),
        ("Which items cost less than 3?", "SELECT name FROM item WHERE price < 3", "filter"),
        ("What is the average price?", "SELECT avg(price) FROM item", "aggregate"),
    ]
    rows = [
        {"question": q, "gold_sql": sql, "family": family, "db_id": "shop", "db_path": db_path}
        for q, sql, family in queries
    ]
    if missing_db:
        rows[2]["db_path"] = f"{db_dir}/gone.sqlite"
    return DatasetDict(train=Dataset.from_list(rows[:1]), test=Dataset.from_list(rows[1:]))


TRANSFER_PLUGIN = plugin_module("e2e_transfer_env", ParityEnv, parity_tasks, other_tasks, sql_tasks)
PARITY = [
    "env=plugin",
    "env.name=e2e_transfer_env.ParityEnv",
    "env.tasks._target_=e2e_transfer_env.parity_tasks",
    "env.eval_tasks=8",
    "num_steps=2",
    "eval_every=1",
    "sft.steps=1",
    "sft.batch_size=2",
]
TRANSFER = [
    "+transfer.tasks._target_=e2e_transfer_env.other_tasks",
    "transfer.eval_tasks=12",  # of 16: a sample, drawn like the held-out set
    "transfer.eval_seed=3",
]
