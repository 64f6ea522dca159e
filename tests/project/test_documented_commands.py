"""Every `python train.py ...` command the README, docs/ and the conf/ headers give composes, with the keys
and options it names, and passes the config checks that run before a model loads: a renamed key, a removed
option or a value out of range in a documented command fails here. Placeholders (`...`, `RUN_DIR`,
`/path/to/spider`) stay as written, since no check reads a path; `K` stands for a number. `env=arith` needs
its plugin installed first (docs/environments.md): tests/envs/test_arith_plugin.py runs that command."""

import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from rl.config.checks import check_config
from rl.config.schema import register_configs

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "conf").rglob("*.yaml")),
]
COMMAND = re.compile(r"python train\.py((?: +[^ `#|]+)*)")
FLAGS = ("-m", "--multirun")  # a sweep: each of its values is one job, composed here with the first
PLACEHOLDERS = {"K": "8"}
NEEDS_A_PLUGIN = "env=arith"


def documented_commands() -> list[tuple[str, tuple[str, ...]]]:
    """(where, overrides) of each distinct command: the words after `python train.py` up to a comment."""
    found: dict[tuple[str, ...], str] = {}
    for path in DOCUMENTS:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in COMMAND.finditer(line):
                words = tuple(w for w in shlex.split(match.group(1)) if w not in FLAGS)
                if NEEDS_A_PLUGIN not in words:
                    found.setdefault(words, f"{path.relative_to(REPO)}:{number}")
    return [(where, words) for words, where in found.items()]


def job_overrides(words: tuple[str, ...]) -> list[str]:
    """The overrides of one job: `--cfg job` prints the config (no override), `[key=...]` is optional
    (left out), a sweep's `a,b` takes its first value, and a placeholder number becomes one."""
    out = []
    skip = False
    for word in words:
        if skip or word.startswith("["):
            skip = False
            continue
        if word == "--cfg":
            skip = True  # its argument (job)
            continue
        key, _, value = word.partition("=")
        value = PLACEHOLDERS.get(value, value.split(",")[0] if "," in value and "[" not in value else value)
        out.append(f"{key}={value}")
    return out


COMMANDS = documented_commands()


def test_the_documents_give_the_commands_a_newcomer_runs():
    words = {w for _, command in COMMANDS for w in command}
    assert len(COMMANDS) > 30
    assert {"mode=eval", "mode=export", "mode=serve", "+experiment=spider_sft", "env=plugin"} <= words


@pytest.fixture(scope="module")
def compose_job():
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        yield lambda overrides: compose("train", overrides=["run_dir=/tmp/documented", *overrides])


@pytest.mark.parametrize("where, words", COMMANDS, ids=[where for where, _ in COMMANDS])
def test_a_documented_command_composes_and_passes_the_checks(compose_job, where, words):
    check_config(compose_job(job_overrides(words)))
