"""An OpenAI-compatible HTTP server over the rollout engine (`python train.py mode=serve`)."""

from serve.app import build_app, listen, run_server

__all__ = ["build_app", "listen", "run_server"]
