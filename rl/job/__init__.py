"""Running a job: the run's parts built from the config and the engine interface they share, one GRPO step,
the stages around the steps (evaluations, the warm start), resuming and logging, mode=eval and mode=export;
the config schema and its checks, model loading, task data and the curriculum, playing groups out,
evaluation, checkpoints, logging, the run summary and report, data parallelism, and the engine in a
rollout-worker process."""
