"""The example plugin in examples/arith_env: found through its `pagedrl.envs` entry point, with its config.

The test writes the ``.dist-info`` that ``pip install`` would write (METADATA + entry_points.txt, taken from
the plugin's own pyproject.toml) into a temporary directory on sys.path: no network, no install.
"""

import json
import operator
import os
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException

from envs import (
    ENTRY_POINT_GROUP,
    EnvError,
    available_envs,
    make_env,
    plugin_config_dirs,
    registry,
    start_episodes,
    step_episodes,
)
from rl.config.checks import check_config
from rl.config.schema import register_configs
from rl.settings import ConfigError

REPO = Path(__file__).resolve().parents[2]
PLUGIN_ROOT = REPO / "examples" / "arith_env"


def declared_entry_points(pyproject: str) -> dict[str, str]:
    """The ``[project.entry-points."pagedrl.envs"]`` table of a pyproject.toml, read line by line."""
    header = f'[project.entry-points."{ENTRY_POINT_GROUP}"]'
    lines = pyproject.split(header, 1)[1].split("\n[", 1)[0].splitlines()
    pairs = (line.split("=", 1) for line in lines if "=" in line)
    return {key.strip(): value.strip().strip('"') for key, value in pairs}


def write_dist_info(site: Path, name: str, version: str, entry_points: dict[str, str]) -> None:
    dist = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = [f"[{ENTRY_POINT_GROUP}]"] + [f"{k} = {v}" for k, v in entry_points.items()]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture()
def installed_plugin(tmp_path, monkeypatch):
    pyproject = (PLUGIN_ROOT / "pyproject.toml").read_text()
    assert 'name = "pagedrl-arith"' in pyproject and 'version = "0.1.0"' in pyproject
    write_dist_info(tmp_path, "pagedrl-arith", "0.1.0", declared_entry_points(pyproject))
    monkeypatch.syspath_prepend(str(PLUGIN_ROOT))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def compose_train(*overrides):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("train", overrides=[*overrides, "run_dir=/tmp/run"])


def expected_answer(question: str) -> int:
    a, op, b = re.fullmatch(r"What is (\d+) ([-+*]) (\d+)\?", question).groups()
    return {"+": operator.add, "-": operator.sub, "*": operator.mul}[op](int(a), int(b))


def test_plugin_is_found_through_its_entry_point(installed_plugin):
    assert available_envs()["arith"] == "pagedrl_arith.env:ArithEnv"
    (found,) = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == "arith"]
    assert Path(found.dist.locate_file("")) == installed_plugin
    env = make_env("arith", max_turns=2)
    assert type(env).__module__ == "pagedrl_arith.env" and env.max_turns == 2


def test_plugin_episodes(installed_plugin):
    from pagedrl_arith import make_tasks

    tasks = list(make_tasks(6, seed=3))
    assert [t["answer"] for t in tasks] == [expected_answer(t["question"]) for t in tasks]
    assert [t["op"] for t in tasks] == [t["question"].split()[3] for t in tasks]
    env = make_env({"name": "arith", "max_turns": 2})
    episodes = start_episodes(env, tasks[:3])
    assert episodes[0].messages[1]["content"] == tasks[0]["question"]
    right = [f"<answer>{t['answer']}</answer>" for t in tasks[:3]]
    wrong = [f"<answer>{t['answer'] + 1}</answer>" for t in tasks[:3]]
    first = step_episodes(episodes, [right[0], wrong[1], "I think it is big"])
    assert [(r.reward, r.done) for r in first] == [(1.0, True), (0.0, False), (0.0, False)]
    assert first[1].observation == "\n<observation>Incorrect, try again.</observation>\n"
    assert "No <answer>" in first[2].observation
    second = step_episodes(episodes[1:], [right[1], wrong[2]])
    assert [(r.reward, r.done) for r in second] == [(1.0, True), (0.0, True)]
    assert second[0].rewards == {"correct": 1.0}


def test_broken_entry_point_names_the_plugin(tmp_path, monkeypatch):
    write_dist_info(tmp_path, "broken-env", "0.0.1", {"broken": "no_such_plugin_module:Env"})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EnvError, match=r"env plugin 'broken' \(entry point 'no_such_plugin_module:Env'"):
        make_env("broken")


def test_tasks_are_distinct_questions_so_none_held_out_is_trained_on(installed_plugin):
    from pagedrl_arith import make_tasks

    every = make_tasks(3 * 3 * 3, seed=0, max_operand=2)  # all 27 questions on operands 0, 1, 2
    assert len(set(every["question"])) == 27
    with pytest.raises(ValueError, match="operands up to 2 make 27 distinct questions"):
        make_tasks(28, max_operand=2)


def test_the_env_shows_its_ideal_reply_and_names_its_score(installed_plugin):
    env = make_env("arith", max_turns=2)
    task = {"question": "What is 7 * 6?", "answer": 42, "op": "*"}
    (episode,) = start_episodes(env, [task])
    assert env.demonstration(task) == "<answer>42</answer>"
    assert episode.step(env.demonstration(task)).reward == 1.0  # the demonstration wins its own task
    assert env.stop == ("</answer>",)
    assert (env.score_words.success, env.score_words.tasks) == ("answer accuracy", "unseen questions")


def test_env_arith_finds_the_config_the_plugin_ships(installed_plugin):
    assert plugin_config_dirs() == [PLUGIN_ROOT / "pagedrl_arith" / "conf"]
    cfg = compose_train("env=arith")
    assert (cfg.env.name, cfg.env.tasks._target_, cfg.env.tasks.max_operand) == (
        "arith",
        "pagedrl_arith.make_tasks",
        20,
    )
    assert list(cfg.env.eval_labels) == ["op"] and cfg.env.eval_tasks == 64
    # its recipe (pagedrl_arith/conf/recipe/arith.yaml), and none of the SQL recipe
    assert (cfg.sft.steps, cfg.sft.lr, cfg.num_steps, cfg.rollout.max_tokens) == (20, 5e-4, 10, 16)
    assert (cfg.curriculum.enabled, cfg.rollout.temperature) == (False, 1.0)
    check_config(cfg)


def test_without_the_plugin_installed_there_is_no_env_arith(monkeypatch):
    monkeypatch.setattr(registry, "entry_points", lambda group: [])  # no plugin installed, whatever is
    assert plugin_config_dirs() == []
    with pytest.raises(MissingConfigException, match="Could not find 'env/arith'"):
        compose_train("env=arith")


def test_env_plugin_naming_a_plugin_with_its_own_config_names_the_command_that_runs_it(installed_plugin):
    cfg = compose_train("env=plugin", "env.name=arith")
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    assert str(err.value) == (
        f"the env plugin 'arith' ships its own config ({PLUGIN_ROOT}/pagedrl_arith/conf/env/arith.yaml: "
        "its task source and recipe); run it with `python train.py env=arith` instead of env=plugin "
        "env.name=arith"
    )


# measured 0.000 -> 0.594 after the warm start -> 0.578 after GRPO (README, "Custom environments"): the task's
# 30 points are 0.28 below that, more than twice the largest 95% half-interval at 64 tasks (0.123)
MIN_GAIN = 0.30


@pytest.mark.slow
def test_the_documented_command_learns_arithmetic_in_the_envs_own_words(installed_plugin, tmp_path):
    """`python train.py env=arith`, as the READMEs give it (W&B off, a known run directory): held-out answer
    accuracy rises by at least 30 points over the untouched model's. About 12 minutes on a busy 2-core CPU."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(installed_plugin), str(PLUGIN_ROOT)])}
    command = [sys.executable, "train.py", "env=arith", f"run_dir={run_dir}", "logger.wandb.mode=disabled"]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    (tmp_path / "train.log").write_text(result.stdout + result.stderr)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["success_name"], summary["eval_tasks_name"], summary["num_eval_tasks"]) == (
        "answer accuracy",
        "unseen questions",
        64,
    )
    assert "held-out greedy answer accuracy (64 unseen questions, 95% CI):" in result.stdout
    assert "schemas" not in result.stdout
    assert summary["final_accuracy"] >= summary["base_accuracy"] + MIN_GAIN, summary["eval_history"]
