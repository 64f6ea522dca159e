"""What several test modules share, imported as `tests.helpers.<module>` (pytest puts the repository root on
sys.path; child processes run with the root as their working directory or on PYTHONPATH). Fixtures stay in
the conftest files.

- tiny_models: the one factory of tiny random Llama / Qwen2 / Qwen3 models (tiny_config, tiny_model) and the
  trainer's tiny Llama (tiny_llama)
- trainer_batch: the trainer tests' hand-laid rollout batch and LoRA adapter; ddp_grad_worker: the rank
  script of the DDP gradient test
- lora_training: the checkpoint tests' tiny LoRA model, optimizer, scheduler and seeded training step
- train_runs: configs composed for tiny runs (tests `import train` and call train.train(cfg)), a tiny
  checkpoint with a random adapter; plugin_envs: the plugin envs those runs use (vowels, parity and its
  transfer sources)
- rollout_tiny_models: the engine tests' models (with a random LoRA adapter too), engine builder and
  transformers references; cuda_graph_cases: the CUDA-graph tests' runners and decode steps
- sync_fake_receiver: engine stand-ins for the weight-sync tests
- live_server: a live OpenAI-compatible server over the tiny model, for the `openai` client
- ctrl_c: children a test stops with Ctrl-C, started with SIGINT at its default
"""
