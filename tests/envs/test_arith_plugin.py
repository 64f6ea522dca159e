"""The example plugin in examples/arith_env, found through its `pagedrl.envs` entry point.

The test writes the ``.dist-info`` that ``pip install`` would write (METADATA + entry_points.txt, taken from
the plugin's own pyproject.toml) into a temporary directory on sys.path: no network, no install.
"""

import operator
import re
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from envs import ENTRY_POINT_GROUP, EnvError, available_envs, make_env, start_episodes, step_episodes

PLUGIN_ROOT = Path(__file__).resolve().parents[2] / "examples" / "arith_env"


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
