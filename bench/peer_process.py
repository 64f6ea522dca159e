"""Running a peer in its own venv: one request in, one result out, each a JSON file."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path


def run_peer(name: str, python: Path, worker: Path, request: dict, env: dict[str, str] | None = None) -> dict:
    """`python worker request.json result.json`; exits with the peer's last output when it fails."""
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
            sys.exit(f"{name} failed (exit {done.returncode}); its last output:\n{tail}")
        return json.loads(result_path.read_text())
