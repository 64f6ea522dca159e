"""python -m rl.eval.compare: two evaluations paired task by task, with McNemar's exact test."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rl.eval.compare import CompareError, compare, load_outcomes, main, mcnemar_p, outcome_file

REPO = Path(__file__).resolve().parents[2]


def test_mcnemar_p_matches_hand_worked_binomial_tails():
    assert mcnemar_p(0, 6) == 0.03125  # 2 * C(6,0) / 2^6 = 2/64
    assert mcnemar_p(6, 0) == 0.03125  # two-sided: the same either way round
    assert mcnemar_p(1, 9) == 0.021484375  # 2 * (C(10,0) + C(10,1)) / 2^10 = 22/1024
    assert mcnemar_p(2, 8) == pytest.approx(2 * (1 + 10 + 45) / 1024)  # 0.109375
    assert mcnemar_p(0, 5) == 0.0625  # 2/32: five discordant tasks cannot reach p < 0.05
    assert mcnemar_p(4, 4) == mcnemar_p(0, 0) == mcnemar_p(7, 7) == 1.0  # capped at 1
    assert mcnemar_p(0, 200) > 0  # no underflow to 0 for large counts


def write(path: Path, rows) -> Path:
    """rows: (key, family, success) triples as an outcome file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"key": k, "family": f, "success": s, "reward": float(s)}) for k, f, s in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_tasks_pair_by_key_and_count_the_discordant_ones(tmp_path):
    # A's file is in another order and has one task B lacks; B has one A lacks
    a = write(tmp_path / "a.jsonl", [("t3", "join", 0), ("t1", "filter", 1), ("t2", "filter", 1),
                                     ("t4", "join", 1), ("t5", "join", 0), ("onlyA", "join", 1)])  # fmt: skip
    b = write(tmp_path / "b.jsonl", [("t1", "filter", 1), ("t2", "filter", 0), ("t3", "join", 1),
                                     ("t4", "join", 0), ("t5", "join", 0), ("onlyB", "join", 0)])  # fmt: skip
    result = compare(load_outcomes(a), load_outcomes(b))
    total = result.total
    assert (total.n, total.wins_a, total.wins_b, total.b, total.c) == (5, 3, 2, 2, 1)
    assert (result.only_a, result.only_b) == (1, 1)
    assert total.p_value == 1.0  # 2 * (C(3,0) + C(3,1)) / 8 = 1
    filter_, join = result.by_value["filter"], result.by_value["join"]
    assert (filter_.n, filter_.b, filter_.c) == (2, 1, 0)  # t2: A right, B wrong
    assert (join.n, join.wins_a, join.wins_b, join.b, join.c) == (3, 1, 1, 1, 1)


def test_the_printed_table_gives_n_accuracies_b_c_and_p(tmp_path, capsys):
    # 10 discordant tasks, 9 of them for B: p = 22/1024
    rows_a = [(f"t{i}", "agg", int(i == 0)) for i in range(10)] + [(f"s{i}", "filter", 1) for i in range(4)]
    rows_b = [(f"t{i}", "agg", int(i != 0)) for i in range(10)] + [(f"s{i}", "filter", 1) for i in range(4)]
    main([str(write(tmp_path / "a.jsonl", rows_a)), str(write(tmp_path / "b.jsonl", rows_b))])
    out = capsys.readouterr().out
    assert "14 paired tasks\n" in out
    assert out.splitlines()[4].split() == ["all", "14", "0.357", "0.929", "1", "9", "0.02148"]
    assert out.splitlines()[5].split() == ["family=agg", "10", "0.100", "0.900", "1", "9", "0.02148"]
    assert out.splitlines()[6].split() == ["family=filter", "4", "1.000", "1.000", "0", "0", "1"]


def test_files_without_a_shared_task_or_with_a_repeated_task_are_refused(tmp_path):
    a = write(tmp_path / "a.jsonl", [("t1", "join", 1), ("t2", "join", 0)])
    other = write(tmp_path / "other.jsonl", [("u1", "join", 1)])
    with pytest.raises(CompareError, match="share no tasks"):
        compare(load_outcomes(a), load_outcomes(other))
    twice = write(tmp_path / "twice.jsonl", [("t1", "join", 1), ("t2", "join", 0), ("t1", "join", 0)])
    with pytest.raises(CompareError, match=r"task t1 appears twice in .*twice.jsonl \(lines 1 and 3\)"):
        load_outcomes(twice)
    (tmp_path / "bad.jsonl").write_text('{"key": "t1"}\n')
    with pytest.raises(CompareError, match="line 1 of .*bad.jsonl is not an outcome record"):
        load_outcomes(tmp_path / "bad.jsonl")


def test_the_command_refuses_with_one_line(tmp_path):
    a = write(tmp_path / "a.jsonl", [("t1", "join", 1)])
    b = write(tmp_path / "b.jsonl", [("u1", "join", 1)])
    done = subprocess.run(
        [sys.executable, "-m", "rl.eval.compare", str(a), str(b)], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("error: the two files share no tasks")
    assert len(done.stderr.splitlines()) == 1


def test_a_run_directory_gives_the_file_of_a_set_and_stage(tmp_path):
    evals = tmp_path / "evals"
    for name in ("held_out_base_0", "held_out_sft_20", "held_out_grpo_10", "held_out_grpo_40",
                 "held_out_grpo_5", "transfer_base_0", "transfer_grpo_40"):  # fmt: skip
        write(evals / f"{name}.jsonl", [("t1", "join", 1)])
    assert outcome_file(tmp_path, "held_out", "final").name == "held_out_grpo_40.jsonl"  # not 5 (text order)
    assert outcome_file(tmp_path, "held_out", "sft").name == "held_out_sft_20.jsonl"
    assert outcome_file(tmp_path, "held_out", "grpo_10").name == "held_out_grpo_10.jsonl"
    assert outcome_file(tmp_path, "transfer", "base").name == "transfer_base_0.jsonl"
    assert outcome_file(evals / "held_out_grpo_5.jsonl", "transfer", "final").name == "held_out_grpo_5.jsonl"
    with pytest.raises(CompareError, match="no transfer evaluation at stage 'sft'; it has: base_0, grpo_40"):
        outcome_file(tmp_path, "transfer", "sft")
    with pytest.raises(CompareError, match="holds no nothing_<stage>_<step>.jsonl"):
        outcome_file(tmp_path, "nothing", "final")
    # a run from another run's checkpoint scores it first: its final evaluation is what it trained to
    resumed = tmp_path / "resumed"
    for name in ("held_out_checkpoint_0", "held_out_sft_147"):
        write(resumed / "evals" / f"{name}.jsonl", [("t1", "join", 1)])
    assert outcome_file(resumed, "held_out", "final").name == "held_out_sft_147.jsonl"
    assert outcome_file(resumed, "held_out", "checkpoint").name == "held_out_checkpoint_0.jsonl"
