"""A run's matmul floor: the seconds its products take alone, replayed at its own step shapes.

`step_shapes(engine)` records each engine step's (tokens, logits rows); `matmul_floor_s(engine, shapes)` then
multiplies that many rows through every product the engine makes, with its own weights and packs, and nothing
else. bench/rollout.py and bench/rollout_vllm.py print it beside the engine's rate: an engine on these
products can near that rate, never beat it.
"""

from __future__ import annotations

import contextlib
import time

import torch

from rollout_engine import LLMEngine
from rollout_engine.models.linear import linears


@contextlib.contextmanager
def step_shapes(engine: LLMEngine):
    """Yields a list that gets each engine step's (tokens, logits rows), as the model runner packs them."""
    shapes: list[tuple[int, int]] = []
    prepare = engine.runner.prepare

    def recorded(scheduled, rows_per_item):
        inputs = prepare(scheduled, rows_per_item)
        shapes.append((inputs.input_ids.numel(), inputs.logits_indices.numel()))
        return inputs

    engine.runner.prepare = recorded
    try:
        yield shapes
    finally:
        del engine.runner.prepare  # the class's method again


def matmul_floor_s(engine: LLMEngine, shapes: list[tuple[int, int]]) -> float:
    """Seconds a run's matmuls take alone: each step's tokens through every decoder layer's `products` as the
    engine makes them (q/k/v stacked, o, gate/up stacked, down: `linears` on the model's own weights and
    packs) and its logits rows through the LM head, with nothing in between: no attention, norms, sampling
    or scheduling. An engine on these products can near it, never beat it."""
    decoder = engine.runner.model
    products = [stack for layer in decoder.layers for stack in layer.products]
    head = decoder.lm_head
    most = max(max(tokens, rows) for tokens, rows in shapes)
    widths = {layer.in_features for group in products for layer in group} | {head.in_features}
    inputs = {width: torch.randn(most, width, dtype=head.weight.dtype) for width in widths}
    start = time.perf_counter()
    with torch.inference_mode():
        for tokens, rows in shapes:
            for group in products:
                linears(inputs[group[0].in_features][:tokens], group)
            linears(inputs[head.in_features][:rows], (head,))
    return time.perf_counter() - start
