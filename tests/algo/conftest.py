"""The trainer tests' tiny Llama, its LoRA adapter and the hand-laid rollout batch, as fixtures."""

import functools

import pytest

from tests.helpers.tiny_models import tiny_llama
from tests.helpers.trainer_batch import VOCAB, rollout_batch, with_lora


@pytest.fixture
def make_llama():
    return functools.partial(tiny_llama, VOCAB)


@pytest.fixture
def make_lora():
    return with_lora


@pytest.fixture
def make_batch():
    return rollout_batch
