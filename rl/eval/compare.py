"""Two evaluations on the same tasks, compared task by task: accuracy of each and McNemar's exact test.

    python -m rl.eval.compare A B [--set held_out|transfer] [--stage final|base|sft|grpo_20] [--by family]

A and B are outcome files (``RUN_DIR/evals/<set>_<stage>_<step>.jsonl``, one line per task) or run
directories, in which ``--set`` (default ``held_out``) and ``--stage`` (default ``final``: the last
evaluation, e.g. ``grpo_40``) pick the file. Tasks are paired by their key. b counts the tasks A solved and B
did not, c the reverse; under "A and B are equally good" each discordant task is a fair coin, so the exact
two-sided p-value is that of b successes in b + c tosses. The same table follows for each value of ``--by``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl.eval.outcomes import EVALS_DIR

# how "final" orders a run's evaluations: a run from checkpoint= scores it first, as "checkpoint_<step>"
STAGE_ORDER = ("base", "checkpoint", "sft", "grpo")


class CompareError(ValueError):
    """The two inputs cannot be paired; the message says why."""


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value: twice the binomial(b + c, 1/2) tail at min(b, c), at most 1."""
    n = b + c
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1))
    return min(1.0, 2 * tail / 2**n)


@dataclass(frozen=True, slots=True)
class PairedCounts:
    """Paired successes of A and B on `n` tasks: b = A right and B wrong, c = A wrong and B right."""

    n: int
    wins_a: int
    wins_b: int
    b: int
    c: int

    @property
    def p_value(self) -> float:
        return mcnemar_p(self.b, self.c)


def load_outcomes(path: str | Path) -> dict[str, dict[str, Any]]:
    """An outcome file's records by task key; a key seen twice, or a line without key and success, is
    refused."""
    records: dict[str, dict[str, Any]] = {}
    lines: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
                key, _ = record["key"], record["success"]
            except (ValueError, KeyError, TypeError):
                raise CompareError(
                    f"line {line} of {path} is not an outcome record (a JSON object with key and success)"
                ) from None
            if key in records:
                raise CompareError(
                    f"task {key} appears twice in {path} (lines {lines[key]} and {line}): an outcome file "
                    "holds each task once; compare two files written by single evaluations"
                )
            records[key], lines[key] = record, line
    return records


def count(pairs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> PairedCounts:
    wins = [(bool(a["success"]), bool(b["success"])) for a, b in pairs]
    return PairedCounts(
        n=len(wins),
        wins_a=sum(a for a, _ in wins),
        wins_b=sum(b for _, b in wins),
        b=sum(a and not b for a, b in wins),
        c=sum(b and not a for a, b in wins),
    )


@dataclass(slots=True)
class Comparison:
    total: PairedCounts
    by_value: dict[str, PairedCounts]  # the paired counts of each value of the `by` label
    only_a: int  # tasks of A without a partner in B (left out)
    only_b: int


def compare(a: Mapping[str, Mapping], b: Mapping[str, Mapping], by: str = "family") -> Comparison:
    """Pair the records of A and B by key; refuses inputs that share no task."""
    shared = [key for key in a if key in b]
    if not shared:
        raise CompareError(
            f"the two files share no tasks (A has {len(a)}, B {len(b)}, matched by key): compare evaluations "
            "of the same set (held_out with held_out, transfer with transfer) drawn with the same eval_seed"
        )
    groups: dict[str, list] = {}
    for key in shared:
        if by in a[key]:
            groups.setdefault(str(a[key][by]), []).append((a[key], b[key]))
    return Comparison(
        total=count([(a[key], b[key]) for key in shared]),
        by_value={value: count(pairs) for value, pairs in sorted(groups.items())},
        only_a=len(a) - len(shared),
        only_b=len(b) - len(shared),
    )


def comparison_text(result: Comparison, name_a: str, name_b: str, by: str = "family") -> str:
    lines = [f"A: {name_a}", f"B: {name_b}", f"{result.total.n} paired tasks"]
    if result.only_a or result.only_b:
        lines[-1] += f" ({result.only_a} of A and {result.only_b} of B have no partner and are left out)"
    lines.append(f"{'':28} {'n':>5} {'acc A':>6} {'acc B':>6} {'b':>5} {'c':>5} {'McNemar p':>10}")
    rows = [("all", result.total)] + [(f"{by}={value}", c) for value, c in result.by_value.items()]
    for name, c in rows:
        lines.append(
            f"{name:28} {c.n:5d} {c.wins_a / c.n:6.3f} {c.wins_b / c.n:6.3f} {c.b:5d} {c.c:5d} "
            f"{c.p_value:10.4g}"
        )
    lines.append(
        "b: A right, B wrong; c: A wrong, B right; p: exact two-sided McNemar test (b of b + c at 1/2)"
    )
    return "\n".join(lines)


def outcome_file(path: str | Path, set_name: str, stage: str) -> Path:
    """`path` itself when it is a file; in a run directory, the ``evals/`` file of `set_name` at `stage`
    (``final``, ``base``, ``sft``, or ``<stage>_<step>`` such as ``grpo_20``)."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise CompareError(f"{path} is neither an outcome file nor a run directory")
    pattern = re.compile(rf"{re.escape(set_name)}_([a-z]+)_(\d+)\.jsonl")
    found = {}
    for file in (path / EVALS_DIR).glob(f"{set_name}_*.jsonl"):
        match = pattern.fullmatch(file.name)
        if match and match[1] in STAGE_ORDER:
            found[(STAGE_ORDER.index(match[1]), int(match[2]))] = (f"{match[1]}_{match[2]}", file)
    if not found:
        raise CompareError(f"{path / EVALS_DIR} holds no {set_name}_<stage>_<step>.jsonl outcome files")
    ordered = [found[k] for k in sorted(found)]
    if stage == "final":
        return ordered[-1][1]
    picked = [file for name, file in ordered if name == stage or name.split("_")[0] == stage]
    if not picked:
        names = ", ".join(name for name, _ in ordered)
        raise CompareError(f"{path} has no {set_name} evaluation at stage {stage!r}; it has: {names}")
    return picked[-1]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rl.eval.compare", description=__doc__.split("\n")[0])
    parser.add_argument("a", help="outcome file (evals/<set>_<stage>_<step>.jsonl) or run directory")
    parser.add_argument("b", help="the same, for the run compared with A")
    parser.add_argument("--set", default="held_out", help="in a run directory: held_out or transfer")
    parser.add_argument("--stage", default="final", help="in a run directory: final, base, sft, grpo_20 ...")
    parser.add_argument("--by", default="family", help="task label to break the comparison down by")
    args = parser.parse_args(argv)
    try:
        file_a, file_b = (outcome_file(p, args.set, args.stage) for p in (args.a, args.b))
        result = compare(load_outcomes(file_a), load_outcomes(file_b), args.by)
    except (CompareError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")
    print(comparison_text(result, str(file_a), str(file_b), args.by))


if __name__ == "__main__":
    main()
