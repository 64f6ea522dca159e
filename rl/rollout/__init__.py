"""Rollouts: prompts as the engine's token ids (`prompts`), and GRPO groups played out against an env, turn by
turn, into trajectories and the trainer's batch (`play`). Used by the job and by the server (serve/)."""
