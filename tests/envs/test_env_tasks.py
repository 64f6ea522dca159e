"""What an env.tasks target may return: checked row by row at load, split, or refused with one message."""

import pytest
from datasets import Dataset, DatasetDict

from envs import BaseEnv, EnvError
from envs.sql import SqlEnv
from envs.tasks import call_task_source, task_splits


class AnyTaskEnv(BaseEnv):
    """An env that keeps BaseEnv's check_task: every row is playable."""

    max_turns = 1

    def start(self, task):
        raise AssertionError("task_splits never starts an episode")


def rows(n):
    return [{"question": f"q{i}"} for i in range(n)]


def test_a_dataset_is_split_90_10_and_a_dataset_dict_is_kept():
    splits = task_splits(Dataset.from_list(rows(20)), AnyTaskEnv(), "my.tasks", seed=0)
    assert (len(splits["train"]), len(splits["test"])) == (18, 2)
    given = DatasetDict(train=Dataset.from_list(rows(3)), test=Dataset.from_list(rows(2)))
    kept = task_splits(given, AnyTaskEnv(), "my.tasks", seed=0)
    assert kept["train"]["question"] == ["q0", "q1", "q2"] and len(kept["test"]) == 2


@pytest.mark.parametrize(
    "returned, described",
    [
        (rows(10), "returned a list"),
        (None, "returned a NoneType"),
        ({"train": Dataset.from_list(rows(3))}, "returned a dict with keys ['train']"),
        ({"train": rows(3), "test": rows(2)}, "returned a dict with keys ['test', 'train']"),
    ],
)
def test_anything_else_is_one_error_naming_the_target_and_what_it_must_return(returned, described):
    with pytest.raises(EnvError) as err:
        task_splits(returned, AnyTaskEnv(), "my.tasks", seed=0)
    message = str(err.value)
    assert f"the task source my.tasks {described}" in message
    assert "datasets.DatasetDict with 'train' and 'test' splits" in message and "Dataset.from_list" in message


def test_empty_splits_are_refused():
    empty = DatasetDict(train=Dataset.from_list(rows(3)), test=Dataset.from_list([]))
    with pytest.raises(EnvError, match="returned an empty 'test' split"):
        task_splits(empty, AnyTaskEnv(), "my.tasks", seed=0)


def test_a_row_the_env_cannot_play_is_named_at_load(staff_db):
    good = {"question": "Who?", "db_path": staff_db, "gold_sql": "SELECT 1", "schema": "CREATE ..."}
    test = [good, good, {**good, "db_path": "/gone/db.sqlite"}]
    tasks = DatasetDict(train=Dataset.from_list([good] * 3), test=Dataset.from_list(test))
    with pytest.raises(EnvError) as err:
        task_splits(tasks, SqlEnv(), "envs.sql.loaders.load_spider", seed=0)
    assert str(err.value).startswith(
        "task row 2 of the 'test' split from envs.sql.loaders.load_spider: the task's database "
        "db_path='/gone/db.sqlite' does not exist"
    )
    unsplit = Dataset.from_list([good, {**good, "question": None}, good])
    with pytest.raises(EnvError, match="task row 1 of the tasks from t: the task's 'question' is None"):
        task_splits(unsplit, SqlEnv(), "t", seed=0)


def test_a_task_source_that_refuses_its_arguments_is_one_error_naming_it(tmp_path):
    missing = tmp_path / "no_spider_here"
    with pytest.raises(EnvError) as refused:
        call_task_source({"_target_": "envs.sql.loaders.spider_tasks", "root": str(missing)})
    message = str(refused.value)
    assert message.startswith("the task source envs.sql.loaders.spider_tasks: ") and str(missing) in message
    with pytest.raises(EnvError, match="the task source envs.sql.loaders.no_such_source: "):
        call_task_source({"_target_": "envs.sql.loaders.no_such_source"})


def test_a_bug_inside_a_task_source_keeps_its_traceback():
    with pytest.raises(Exception) as raised:
        call_task_source({"_target_": "builtins.divmod", "_args_": [1, 0]})
    assert not isinstance(raised.value, EnvError) and isinstance(raised.value.__cause__, ZeroDivisionError)
