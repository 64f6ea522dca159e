"""Running a peer in its own venv: one request in, one result out, each a JSON file."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path


def run_peer(
    name: str,
    python: Path,
    worker: Path,
    request: dict,
    env: dict[str, str] | None = None,
    fatal: bool = True,
) -> dict | None:
    """`python worker request.json result.json`; when it fails, exits with the peer's last output, or (not
    `fatal`) prints it and returns None."""
    with tempfile.TemporaryDirectory() as tmp:
        request_path, result_path = Path(tmp, "request.json"), Path(tmp, "result.json")
        request_path.write_text(json.dumps(request))
        done = subprocess.run(
            [str(python), str(worker), str(request_path), str(result_path)],
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0 or not result_path.exists():
            tail = (done.stdout + done.stderr)[-4000:]
            message = f"{name} failed (exit {done.returncode}); its last output:\n{tail}"
            if fatal:
                sys.exit(message)
            print(message, file=sys.stderr)
            return None
        return json.loads(result_path.read_text())
