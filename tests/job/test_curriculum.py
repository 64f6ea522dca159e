"""The adaptive curriculum: hand-worked weights, skipped tasks, draws that follow p(1 - p), exact resume."""

import pytest
import torch

from rl.tasks.curriculum import Curriculum, CurriculumConfig

# two pools of three tasks each
TASKS = [{"q": f"t{i}", "family": "easy" if i < 3 else "hard"} for i in range(6)]


def test_weights_follow_the_pooled_posterior_by_hand():
    c = Curriculum(TASKS, pool_by=["family"], prior_strength=8.0, min_attempts=16)
    assert torch.allclose(c.weights(), torch.full((6,), 0.25, dtype=torch.float64))  # untried: p = 1/2
    c.record([(TASKS[0], 3, 8)])
    # pool "easy": (3 + 1) / (8 + 2) = 0.4; task 0: (3 + 8 * 0.4) / (8 + 8) = 0.3875; tasks 1, 2: 0.4
    assert c.pool_rates() == {"easy": pytest.approx(0.4), "hard": pytest.approx(0.5)}
    w = c.weights()
    assert w[0].item() == pytest.approx(0.3875 * 0.6125)
    assert w[1].item() == w[2].item() == pytest.approx(0.4 * 0.6)
    assert w[3].item() == pytest.approx(0.25)


def test_mastered_and_hopeless_tasks_are_skipped_once_seen_enough():
    c = Curriculum(TASKS, pool_by=["family"], min_attempts=16)
    c.record([(TASKS[0], 8, 8), (TASKS[3], 0, 8)])
    assert (c.weights() > 0).all()  # 8 attempts are not yet enough to give up on a task
    c.record([(TASKS[0], 8, 8), (TASKS[3], 0, 8), (TASKS[4], 1, 16)])
    w = c.weights()
    assert w[0] == 0 and w[3] == 0 and w[4] > 0
    for _ in range(30):
        drawn = c.next_batch(4)
        assert TASKS[0] not in drawn and TASKS[3] not in drawn
        assert len({row["q"] for row in drawn}) == 4  # distinct while enough tasks are live


def test_draws_favour_the_pool_nearest_one_half():
    tasks = [{"q": f"e{i}", "family": "easy"} for i in range(50)]
    tasks += [{"q": f"m{i}", "family": "mid"} for i in range(50)]
    c = Curriculum(tasks, pool_by=["family"], prior_strength=8.0)
    c.record([(tasks[0], 190, 200), (tasks[50], 100, 200)])  # pools at ~0.95 and 0.5
    counts = {"easy": 0, "mid": 0}
    for _ in range(200):
        for row in c.next_batch(2):
            counts[row["family"]] += 1
    # weights ~0.05 against 0.25: the mid pool should get about 5/6 of the draws
    assert counts["mid"] > 3 * counts["easy"]


def test_position_restores_the_same_next_draws_and_refuses_another_seed():
    a = Curriculum(TASKS, seed=3, pool_by=["family"])
    a.record([(TASKS[1], 2, 8)])
    a.next_batch(2)
    b = Curriculum(TASKS, seed=3, pool_by=["family"])
    b.restore(a.position())
    assert [a.next_batch(3) for _ in range(5)] == [b.next_batch(3) for _ in range(5)]
    with pytest.raises(ValueError, match="same seed"):
        Curriculum(TASKS, seed=4).restore(a.position())


def test_rows_not_in_the_training_set_are_ignored_and_bad_settings_refused():
    c = Curriculum(TASKS)
    c.record([({"q": "held-out"}, 1, 8)])
    assert c.record_of == {}
    # the curriculum.* keys' own rules (check_config applies them before the curriculum is built)
    assert CurriculumConfig.problems(CurriculumConfig(prior_strength=-1), "curriculum.") == [
        "curriculum.prior_strength=-1: use a finite number >= 0"
    ]
    with pytest.raises(ValueError, match="task set is empty"):
        Curriculum([])


def _databases(sizes):
    return [{"q": f"{db}{i}", "db_id": db, "family": "f"} for db, n in sizes.items() for i in range(n)]


def test_grouped_draws_fill_a_batch_from_one_database_chosen_by_its_total_weight():
    tasks = _databases({"a": 10, "b": 10, "c": 2})
    c = Curriculum(tasks, seed=1, group_by="db_id", prior_strength=0.0, min_attempts=1000)
    # own records only (prior 0): p = 1/2 in a (weight 0.25 each), p = 0.9 in b (0.09 each), c untried
    c.record([(t, 1, 2) for t in tasks[:10]] + [(t, 9, 10) for t in tasks[10:20]])
    c.record([(tasks[20], 1, 2), (tasks[21], 1, 2)])
    counts = {"a": 0, "b": 0, "c": 0}
    for _ in range(600):
        batch = c.next_batch(2)
        assert len({row["q"] for row in batch}) == 2
        dbs = {row["db_id"] for row in batch}
        assert len(dbs) == 1  # every database here holds at least two live tasks
        counts[dbs.pop()] += 1
    # by hand: group totals a 10 x 0.25 = 2.5, b 10 x 0.09 = 0.9, c 2 x 0.25 = 0.5, of 3.9
    for db, total in {"a": 2.5, "b": 0.9, "c": 0.5}.items():
        assert counts[db] / 600 == pytest.approx(total / 3.9, abs=0.06)


def test_grouped_draws_move_to_another_database_when_one_runs_out():
    tasks = _databases({"a": 3, "b": 3})
    c = Curriculum(tasks, seed=2, group_by="db_id")
    for _ in range(20):
        batch = c.next_batch(4)
        dbs = [row["db_id"] for row in batch]
        assert len({row["q"] for row in batch}) == 4
        assert dbs.count(dbs[0]) == 3  # the first database is used up before the second is drawn from
    assert len({row["q"] for row in c.next_batch(8)}) == 6  # only then are tasks repeated


def test_grouping_by_a_field_the_tasks_lack_is_refused():
    with pytest.raises(ValueError, match=r"curriculum.group_by=database: no training task has a field"):
        Curriculum(TASKS, group_by="database")


def test_the_screen_drops_the_tasks_every_sample_solved_or_none_did_and_seeds_the_pools_by_hand():
    c = Curriculum(TASKS, pool_by=["family"], prior_strength=8.0, min_attempts=16)
    assert c.screen([(TASKS[0], 4, 4), (TASKS[1], 0, 4), (TASKS[2], 2, 4)]) == (1, 1)
    # fewer attempts than min_attempts, yet the screen drops tasks 0 and 1 at once
    w = c.weights()
    assert w[0] == 0 and w[1] == 0
    # pool "easy" from the screen: (6 + 1) / (12 + 2) = 0.5; task 2: (2 + 8 * 0.5) / (4 + 8) = 0.5
    assert c.pool_rates()["easy"] == pytest.approx(0.5)
    assert w[2].item() == pytest.approx(0.25)
    assert c.metrics()["curriculum/num_skipped"] == 2.0
    for _ in range(20):
        drawn = c.next_batch(3)
        assert TASKS[0] not in drawn and TASKS[1] not in drawn


def test_a_resume_keeps_what_the_screen_dropped_and_an_older_position_drops_nothing():
    a = Curriculum(TASKS, seed=2)
    a.screen([(TASKS[3], 0, 4), (TASKS[4], 1, 4)])
    b = Curriculum(TASKS, seed=2)
    b.restore(a.position())
    assert torch.equal(b.weights(), a.weights()) and b.weights()[3] == 0
    older = {key: value for key, value in a.position().items() if key != "dropped"}
    c = Curriculum(TASKS, seed=2)
    c.restore(older)
    assert c.weights()[3] > 0  # 4 attempts alone do not settle a task (min_attempts=16)


def test_screen_settings_out_of_range_are_refused():
    bad = CurriculumConfig(screen_tasks=-1, screen_samples=1)
    assert CurriculumConfig.problems(bad, "curriculum.") == [
        "curriculum.screen_tasks=-1: use an integer >= 0 (0: no screen)",
        "curriculum.screen_samples=1: use an integer >= 2 (one sample cannot tell a learnable task)",
    ]
