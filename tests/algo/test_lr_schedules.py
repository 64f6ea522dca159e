"""LR schedules by hand: linear warmup from 0, then constant or cosine down to min_lr_ratio."""

import math

import pytest
import torch

from rl.algo.optim import build_lr_scheduler, build_optimizer


def lrs_over(schedule, num_steps, **kwargs):
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=2.0)
    scheduler = build_lr_scheduler(optimizer, schedule, **kwargs)
    out = []
    for _ in range(num_steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_constant_with_warmup():
    assert lrs_over("constant", 5, warmup_steps=2) == pytest.approx([0.0, 1.0, 2.0, 2.0, 2.0])
    assert lrs_over("constant", 3) == pytest.approx([2.0, 2.0, 2.0])


def test_warmup_then_cosine():
    # after 2 warmup steps the cosine progress is (step - 2) / 4, so factors 1, (1 + cos(pi/4)) / 2, 1/2 ...
    c = math.cos(math.pi / 4)
    expected = [0.0, 0.5, 1.0, (1 + c) / 2, 0.5, (1 - c) / 2, 0.0, 0.0]
    assert lrs_over("cosine", 8, warmup_steps=2, num_training_steps=6) == pytest.approx(
        [2 * f for f in expected]
    )


def test_cosine_floor():
    lrs = lrs_over("cosine", 4, num_training_steps=2, min_lr_ratio=0.1)
    assert lrs == pytest.approx([2.0, 2.0 * (0.1 + 0.9 * 0.5), 0.2, 0.2])


def test_a_cosine_schedule_of_no_steps_builds_at_the_base_lr():
    # an SFT-only control (num_steps=0) of a cosine recipe builds the GRPO scheduler and never steps it
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    build_lr_scheduler(optimizer, "cosine", warmup_steps=0, num_training_steps=0)
    assert optimizer.param_groups[0]["lr"] == 0.5


def test_bad_schedules_are_named():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="unknown LR schedule"):
        build_lr_scheduler(optimizer, "linear")
    with pytest.raises(ValueError, match="needs num_training_steps > warmup_steps"):
        build_lr_scheduler(optimizer, "cosine", warmup_steps=5, num_training_steps=5)
    with pytest.raises(ValueError, match="lr=0.0: use a finite number > 0"):
        build_optimizer(torch.nn.Linear(2, 2), lr=0.0)
