"""Puts this folder's helper module (loop_models) on the path, for the tests and their child processes."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
