"""The learning side: `rl.algo` (the algorithm), `rl.sync` (the adapter and weight sync) and `rl.job`
(running a job), with `rl.settings` (choices, value ranges, ConfigError) shared by all three.

Imports point one way: `rl.job` uses `rl.algo` and `rl.sync`, which import neither each other nor `rl.job`.
"""
