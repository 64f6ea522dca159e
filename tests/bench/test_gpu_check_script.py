"""bench/gpu_check.sh, the prepared GPU check, where CUDA is absent (CUDA_VISIBLE_DEVICES= hides any GPU): it
parses, refuses an unknown part naming the parts, and fails each requested part at once, one line each saying
that CUDA is absent, without running any of them."""

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.sh"
PARTS = ["gpu_tests", "paged_attention", "decode_graphs", "rollout", "weight_sync", "lora"]  # run by default
NAMED_PARTS = ["job"]  # run only when named
NO_CUDA = re.compile(
    r"(\w+): FAIL, CUDA is absent: torch \S+ \(.*\) sees no CUDA device \(CUDA_VISIBLE_DEVICES=\)"
)


def run_check(out: Path, *parts: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "", "OUT": str(out)}
    return subprocess.run(["bash", str(SCRIPT), *parts], env=env, capture_output=True, text=True, timeout=120)


def test_the_script_parses():
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_part_run_alone_without_cuda_fails_in_one_line_and_runs_nothing(tmp_path):
    done = run_check(tmp_path / "out", "paged_attention")
    assert done.returncode == 3, done.stderr
    (line,) = done.stdout.splitlines()
    assert NO_CUDA.fullmatch(line) and NO_CUDA.fullmatch(line)[1] == "paged_attention"
    assert not (tmp_path / "out").exists()  # no part started, so nothing was written


def test_every_part_fails_in_its_own_line_in_order(tmp_path):
    for parts, expected in [((), PARTS), (("lora", "gpu_tests"), ["lora", "gpu_tests"]), (("job",), ["job"])]:
        done = run_check(tmp_path / "out", *parts)
        assert done.returncode == 3, done.stderr
        assert [NO_CUDA.fullmatch(line)[1] for line in done.stdout.splitlines()] == expected


def test_an_unknown_part_is_refused_naming_the_parts(tmp_path):
    done = run_check(tmp_path / "out", "gpu_tests", "attention")
    assert done.returncode == 2 and done.stdout == ""
    assert f"the parts are: {' '.join(PARTS)} (none: all of them), and {' '.join(NAMED_PARTS)}" in done.stderr
    assert "unknown part 'attention'" in done.stderr


def test_the_header_names_every_part_with_its_limit():
    header = SCRIPT.read_text().split("\nset -uo pipefail")[0]
    limits = dict(re.findall(r"\[(\w+)\]=(\d+)", SCRIPT.read_text()))
    assert list(limits) == PARTS + NAMED_PARTS
    for name, seconds in limits.items():
        assert re.search(rf"^#   {name} +{seconds} s  ", header, flags=re.M), name
