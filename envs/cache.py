"""Where the project keeps what it builds once and reuses (the converted default model, the generated SQL
databases): ``$PAGEDRL_CACHE``, by default ``~/.cache/pagedrl``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(name: str) -> Path:
    """The cache entry ``name`` (not created here): under ``$PAGEDRL_CACHE``, else ``~/.cache/pagedrl``."""
    return Path(os.environ.get("PAGEDRL_CACHE", Path.home() / ".cache" / "pagedrl")) / name
