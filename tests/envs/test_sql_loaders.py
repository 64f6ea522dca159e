"""Spider and BIRD from tiny fixture releases, written here in each one's layout, as train and test splits.

The expected splits by database are worked out by hand from the order random.Random(seed) shuffles the
sorted db_ids into: ['a', 'b', 'c', 'd', 'e'] becomes ['c', 'b', 'a', 'e', 'd'] with seed 0 and
['c', 'd', 'e', 'a', 'b'] with seed 1 (pinned by the first test).
"""

import json
import logging
import random
import sqlite3
from pathlib import Path

import hydra
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from envs.sql import SqlEnv, execution_match
from envs.sql.loaders import bird_tasks, spider_tasks, split_by_database, sql_family
from envs.tasks import task_splits
from rl.config.schema import register_configs

CONF = Path(__file__).resolve().parents[2] / "conf"
# questions per database of the training files: 20 in all
SIZES = {"a": 1, "b": 2, "c": 3, "d": 4, "e": 10}


def write_db(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, price REAL)")
    conn.executemany(
        "INSERT INTO items VALUES (?, ?, ?)", [(1, "pen", 1.5), (2, "ink", 7.0), (3, "pad", 3.25)]
    )
    conn.commit()
    conn.close()


def questions(sizes, sql_key="query"):
    """``n`` questions on each database of ``sizes``, named after it: 'c2' is the third question on c."""
    return [
        {"db_id": db_id, "question": f"{db_id}{i}", sql_key: "SELECT count(*) FROM items"}
        for db_id, n in sizes.items()
        for i in range(n)
    ]


def write_part(directory: Path, files: dict, tables_file: str, db_dir: str, db_ids) -> None:
    """Questions files, the tables file listing ``db_ids``, and ``<db_dir>/<db_id>/<db_id>.sqlite`` each."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, rows in files.items():
        (directory / name).write_text(json.dumps(rows))
    (directory / tables_file).write_text(json.dumps([{"db_id": db_id} for db_id in db_ids]))
    for db_id in db_ids:
        write_db(directory / db_dir / db_id / f"{db_id}.sqlite")


def spider_root(tmp_path, train, others=None, dev=None, db_ids=None):
    """Spider's layout: train_spider.json, train_others.json, dev.json, tables.json and database/."""
    files = {"train_spider.json": train, "train_others.json": others, "dev.json": dev}
    files = {name: rows for name, rows in files.items() if rows is not None}
    db_ids = db_ids or sorted(
        {row["db_id"] for rows in files.values() for row in rows if isinstance(row, dict)}
    )
    write_part(tmp_path, files, "tables.json", "database", db_ids)
    return str(tmp_path)


def bird_root(tmp_path, train, dev=None, dev_dir="dev"):
    """BIRD's layout: train/ and dev/, each with <part>.json, <part>_tables.json and <part>_databases/."""
    for part, directory, rows in [("train", "train", train), ("dev", dev_dir, dev)]:
        if rows is not None:
            db_ids = sorted({row["db_id"] for row in rows})
            files = {f"{part}.json": rows}
            write_part(tmp_path / directory, files, f"{part}_tables.json", f"{part}_databases", db_ids)
    return str(tmp_path)


def databases(split):
    return sorted(set(split["db_id"]))


def test_the_hand_worked_shuffles_are_pythons():
    for seed, order in [(0, ["c", "b", "a", "e", "d"]), (1, ["c", "d", "e", "a", "b"])]:
        ids = sorted(SIZES)
        random.Random(seed).shuffle(ids)
        assert ids == order


@pytest.mark.parametrize(
    "test_fraction, split_seed, test_dbs",
    [
        # seed 0 order c, b, a, e, d: c holds 3/20 = 0.15 of the questions, c + b 5/20 = 0.25
        (0.1, 0, ["c"]),  # 0.15 >= 0.1 after c: one database is enough
        (0.2, 0, ["b", "c"]),  # 0.15 < 0.2, so b follows: 0.25
        (0.25, 0, ["b", "c"]),  # exactly 0.25 is enough
        (0.3, 0, ["a", "b", "c"]),  # 0.25 < 0.3, a follows: 6/20 = 0.3
        # seed 1 order c, d, e, a, b: c 0.15, c + d 7/20 = 0.35
        (0.2, 1, ["c", "d"]),
    ],
)
def test_whole_databases_move_into_test_in_the_seeds_order_until_the_fraction_is_reached(
    tmp_path, test_fraction, split_seed, test_dbs
):
    tasks = spider_tasks(spider_root(tmp_path, questions(SIZES)), test_fraction, split_seed)
    assert databases(tasks["test"]) == test_dbs
    assert databases(tasks["train"]) == sorted(set(SIZES) - set(test_dbs))
    # every question lands on the side of its database, in the order of the file
    everything = [row["question"] for row in questions(SIZES)]
    assert tasks["test"]["question"] == [q for q in everything if q[0] in test_dbs]
    assert tasks["train"]["question"] == [q for q in everything if q[0] not in test_dbs]


def test_the_split_is_the_same_for_a_seed_and_differs_for_another(tmp_path):
    root = spider_root(tmp_path, questions(SIZES))
    first, again, other = (spider_tasks(root, 0.2, seed) for seed in (0, 0, 1))
    assert first["test"]["question"] == again["test"]["question"] == ["b0", "b1", "c0", "c1", "c2"]
    assert other["test"]["question"] == ["c0", "c1", "c2", "d0", "d1", "d2", "d3"]


def test_split_by_database_keeps_each_side_in_the_order_rows_came():
    rows = questions(SIZES)[::-1]  # e9 ... e0, d3 ... a0: the databases in another order than sorted
    train, test = split_by_database(rows, test_fraction=0.2, split_seed=0)
    assert [r["question"] for r in test] == ["c2", "c1", "c0", "b1", "b0"]
    assert [r["question"] for r in train] == [r["question"] for r in rows if r["db_id"] not in "bc"]


def test_dev_json_is_the_test_split_and_train_others_joins_train(tmp_path):
    train = questions({"a": 2, "b": 1})
    others = questions({"geo": 2})
    dev = questions({"x": 1, "y": 2})
    root = spider_root(tmp_path, train, others=others, dev=dev)
    tasks = spider_tasks(root, test_fraction=0.5, split_seed=3)  # with dev.json they only get checked
    assert tasks["train"]["question"] == ["a0", "a1", "b0", "geo0", "geo1"]
    assert tasks["test"]["question"] == ["x0", "y0", "y1"]
    assert set(tasks["train"]["source"]) == set(tasks["test"]["source"]) == {"spider"}


def test_a_dev_json_on_training_databases_is_refused(tmp_path):
    root = spider_root(tmp_path, questions({"a": 2, "b": 1}), dev=questions({"b": 1, "x": 1}))
    with pytest.raises(ValueError, match=r"dev\.json asks about 1 database\(s\) the training .* \('b'\)"):
        spider_tasks(root)


def test_spider_rows_and_malformed_rows(tmp_path, caplog):
    dev = [
        {"db_id": "shop", "question": "How many items?", "query": "SELECT count(*) FROM items"},
        {"db_id": "shop", "question": "Cheap items?", "query": "SELECT name FROM items WHERE price < 2"},
        {"db_id": "shop", "question": "No SQL here"},
        {"db_id": "mall", "question": "Unknown db", "query": "SELECT 1"},
        ["not", "an", "object"],
        {"db_id": "shop", "question": "Sorted", "query": "SELECT name FROM items ORDER BY price DESC"},
    ]
    root = spider_root(tmp_path, questions({"a": 1}), dev=dev, db_ids=["a", "shop"])
    with caplog.at_level(logging.WARNING, logger="envs.sql.loaders"):
        data = spider_tasks(root)["test"]
    assert data["question"] == ["How many items?", "Cheap items?", "Sorted"]
    assert data["family"] == ["aggregate", "filter", "order_limit"]
    assert data["difficulty"] == ["easy", "easy", "easy"] and set(data["source"]) == {"spider"}
    assert "row 2 of" in caplog.text and "missing or empty 'query'" in caplog.text
    assert "row 3 of" in caplog.text and "'mall' is not in the tables file" in caplog.text
    assert "row 4 of" in caplog.text and "skipped 3 malformed rows of 6" in caplog.text
    row = data[1]
    assert "CREATE TABLE items" in row["schema"]
    assert execution_match(row["db_path"], row["gold_sql"], "SELECT name FROM items WHERE id = 1")


def test_bird_layout_keeps_evidence_in_the_prompt_and_maps_difficulty(tmp_path):
    dev = [
        {
            "db_id": "shop",
            "question": "Dear items?",
            "evidence": "dear means price > 5",
            "SQL": "SELECT name FROM items WHERE price > 5",
            "difficulty": "moderate",
        },
        {
            "db_id": "shop",
            "question": "Total?",
            "SQL": "SELECT SUM(price) FROM items",
            "difficulty": "challenging",
        },
    ]
    tasks = bird_tasks(bird_root(tmp_path, questions({"a": 2}, sql_key="SQL"), dev=dev))
    assert tasks["train"]["db_path"][0] == str(tmp_path / "train/train_databases/a/a.sqlite")
    test = tasks["test"]
    assert test["db_path"][0] == str(tmp_path / "dev/dev_databases/shop/shop.sqlite")
    assert test["evidence"] == ["dear means price > 5", ""] and set(test["source"]) == {"bird"}
    assert test["difficulty"] == ["medium", "hard"] and test["gold_sql"][1] == "SELECT SUM(price) FROM items"
    prompt = SqlEnv().start(test[0]).messages[-1]["content"]
    assert "CREATE TABLE items" in prompt and prompt.endswith(
        "Hint: dear means price > 5\n\nQuestion: Dear items?"
    )
    assert "Hint" not in SqlEnv().start(test[1]).messages[-1]["content"]


def test_bird_dev_dir_names_a_dated_dev_part_and_without_one_train_is_split_by_database(tmp_path):
    root = bird_root(
        tmp_path, questions(SIZES, sql_key="SQL"), dev=questions({"x": 1}, "SQL"), dev_dir="dev_2024"
    )
    assert databases(bird_tasks(root, dev_dir="dev_2024")["test"]) == ["x"]
    split = bird_tasks(root, test_fraction=0.2, split_seed=0)  # no dev/ under root
    assert (databases(split["test"]), databases(split["train"])) == (["b", "c"], ["a", "d", "e"])


def test_task_splits_keeps_the_database_disjoint_splits(tmp_path):
    tasks = spider_tasks(spider_root(tmp_path, questions(SIZES)), 0.2, 0)
    kept = task_splits(tasks, SqlEnv(), "envs.sql.loaders.spider_tasks", seed=7)
    assert kept["test"]["question"] == tasks["test"]["question"]
    assert kept["train"]["question"] == tasks["train"]["question"]


@pytest.mark.parametrize("test_fraction", [0, 1, -0.1, 1.5, True, "0.1", None])
def test_a_test_fraction_outside_0_1_is_one_error_naming_it(tmp_path, test_fraction):
    root = spider_root(tmp_path, questions(SIZES), dev=questions({"x": 1}))  # refused even with a dev.json
    with pytest.raises(
        ValueError, match=rf"^test_fraction={test_fraction!r}: use a number strictly between 0 and 1"
    ):
        spider_tasks(root, test_fraction=test_fraction)


def test_a_split_that_leaves_train_empty_is_refused(tmp_path):
    root = spider_root(tmp_path / "five", questions(SIZES))
    with pytest.raises(
        ValueError, match=r"test_fraction=0\.99 moves all 5 database\(s\) .* leaves train empty"
    ):
        spider_tasks(root, test_fraction=0.99)
    one = spider_root(tmp_path / "one", questions({"a": 5}))
    with pytest.raises(
        ValueError, match=r"lower test_fraction \(a split by database needs at least 2 databases\)"
    ):
        spider_tasks(one)
    with pytest.raises(ValueError, match=r"split_seed=None: use an integer"):
        spider_tasks(root, split_seed=None)


def test_missing_files_name_the_path_and_the_fix(tmp_path):
    with pytest.raises(
        FileNotFoundError, match="the dataset root '.*nowhere' is not a directory: pass the unzipped"
    ):
        spider_tasks(str(tmp_path / "nowhere"))
    ghost = [{"db_id": "ghost", "question": "q", "query": "SELECT 1"}]
    root = spider_root(tmp_path, questions({"a": 1}), dev=ghost, db_ids=["a"])
    (tmp_path / "tables.json").write_text(json.dumps([{"db_id": "a"}, {"db_id": "ghost"}]))
    with pytest.raises(FileNotFoundError, match=r"db_id 'ghost' not found: .*database/ghost/ghost\.sqlite"):
        spider_tasks(root)
    (tmp_path / "train_spider.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"train_spider\.json does not exist"):
        spider_tasks(root)
    bird = bird_root(tmp_path / "bird", questions({"a": 1}, sql_key="SQL"))
    (tmp_path / "bird/train/train_databases/a/a.sqlite").unlink()
    with pytest.raises(
        FileNotFoundError, match=r"train/train_databases/a/a\.sqlite.*unzip the release's database"
    ):
        bird_tasks(bird)


@pytest.mark.parametrize("option, make_root", [("spider", spider_root), ("bird", bird_root)])
def test_env_configs_run_the_sql_env_on_their_task_source(tmp_path, option, make_root):
    register_configs()
    root = make_root(tmp_path, questions(SIZES, sql_key="query" if option == "spider" else "SQL"))
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[f"env={option}", f"env.tasks.root={root}", "run_dir=/tmp/run"])
        sql = compose("train", overrides=["env=sql", "run_dir=/tmp/run"])
        missing = compose("train", overrides=[f"env={option}", "run_dir=/tmp/run"])
    # the built-in env's arguments, with real schemas shown compact (one line a table)
    assert cfg.env.name == "sql" and cfg.env.args == {**sql.env.args, "schema_style": "compact"}
    assert (
        list(cfg.env.eval_labels) == ["family", "difficulty", "db_id"]
        and cfg.env.shared_prompt_key == "db_id"
    )
    tasks = hydra.utils.call(cfg.env.tasks)
    assert (databases(tasks["test"]), databases(tasks["train"])) == (["c"], ["a", "b", "d", "e"])
    assert OmegaConf.missing_keys(missing) == {"env.tasks.root"}  # required: no default root


@pytest.mark.parametrize(
    "sql, family",
    [
        ("SELECT a FROM t WHERE b = 1", "filter"),
        ("SELECT count(*) FROM t", "aggregate"),
        ("SELECT a FROM t ORDER BY b LIMIT 1", "order_limit"),
        ("SELECT a, count(*) FROM t GROUP BY a HAVING count(*) > 1", "group_having"),
        ("SELECT t.a FROM t JOIN u ON t.id = u.tid", "join2"),
        ("SELECT t.a FROM t JOIN u ON t.id = u.tid JOIN v ON v.id = u.vid", "join3"),
        ("SELECT a FROM t WHERE b > (SELECT avg(b) FROM t)", "nested"),
        ("SELECT a FROM t INTERSECT SELECT a FROM u", "set_ops"),
    ],
)
def test_sql_family(sql, family):
    assert sql_family(sql) == family
