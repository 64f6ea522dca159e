"""What a run reports: the logger (JSONL, W&B, progress bars: `logger`), per-step metrics and the phase timer
(`metrics`), the learning record and printed summary (`summary`), and PNG plots (`plots`:
``python -m rl.report.plots RUN_DIR``)."""
