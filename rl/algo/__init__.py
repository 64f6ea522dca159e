"""The algorithm: rewards to advantages, the rollout batch, per-token logprobs, losses and their aggregations,
importance correction, and the optimisation step with its statistics and optimiser."""
