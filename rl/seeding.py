"""One way to derive a seed: stream `index` of a base seed, so every seeded draw in a run (an epoch's order, a
curriculum draw, a step's sampling, a turn's) takes a seed of its own that the base seed and the index fix."""

SEED_STRIDE = 1_000_003  # a prime larger than any index in one run


def derive_seed(base: int, index: int) -> int:
    """The seed of draw `index` under `base`: base x SEED_STRIDE + index."""
    return base * SEED_STRIDE + index
