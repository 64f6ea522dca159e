"""Reading an evaluation's outcome file (RUN_DIR/evals/*.jsonl) as plain JSON lines, independently of the code
that writes it."""

import json


def read_outcomes(path):
    """The records of an outcome file, in order."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
