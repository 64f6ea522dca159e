"""The one machine-readable line every benchmark ends with, also written to $OUT/<name>.json when $OUT is set
(the GPU check collects them from there)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def emit(name: str, result: dict) -> None:
    """Print `result` as one JSON line, and write it to $OUT/<name>.json when $OUT is set."""
    line = json.dumps(result)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"{name}.json").write_text(line + "\n")
    print(line)
