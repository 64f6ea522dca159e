"""Running a job: the config schema and its checks, model loading, task data and the curriculum, playing
groups out, evaluation, the warm start, checkpoints, logging, the run summary and report, data parallelism,
and the engine in a rollout-worker process."""
