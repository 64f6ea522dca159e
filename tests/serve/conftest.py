"""The tiny model, a live server over it for the module's tests, and an `openai` client of it."""

import pytest

from rl.job.model_loading import load_model
from tests.helpers.live_server import LiveServer, tiny_engine, tiny_model


@pytest.fixture(scope="session")
def tiny():
    """(model, tokenizer): the tiny model with the default model's tokenizer."""
    _, tokenizer = load_model("tiny_llama", dtype="float32", device="cpu")
    return tiny_model(len(tokenizer)), tokenizer


@pytest.fixture(scope="module")
def live(tiny):
    server = LiveServer(tiny_engine(*tiny), tiny[1])
    yield server
    server.close()


@pytest.fixture
def client(live):
    return live.client()
