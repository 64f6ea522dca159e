"""Evaluation: greedy held-out scoring (`evaluate`), the sets a run is scored on (`eval_sets`), per-task
outcome files (`outcomes`), pass@k from samples (`pass_at_k`), and two runs compared task by task
(`compare`: ``python -m rl.eval.compare``)."""
