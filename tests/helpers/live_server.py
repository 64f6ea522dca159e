"""A live server on a free localhost port over a tiny random Llama with the default model's tokenizer, for
the official `openai` client; the transformers references its replies are checked against, the prompts the
tests send, and a stream's chunks gathered per choice."""

import threading
import time

import openai
import torch
import uvicorn

from rl.job.model_loading import TINY_CONFIGS
from rollout_engine import LLMEngine
from serve import build_app, listen
from serve.engine_loop import EngineLoop
from tests.helpers import tiny_models

MODEL = "tiny"
MAX_MODEL_LEN = 128
PROMPTS = ["The capital of France is", "SELECT name FROM users WHERE", "Once upon a time", "def main():"]


def tiny_model(vocab_size: int) -> torch.nn.Module:
    """tiny_llama's shape with peaked random weights: its greedy tokens sit far from ties, and its samples
    wander over the whole vocabulary (multi-byte characters split across tokens included)."""
    config = TINY_CONFIGS["tiny_llama"](vocab_size)
    config.initializer_range = 0.2
    return tiny_models.tiny_model(config, seed=0).eval()


def tiny_engine(model, tokenizer) -> LLMEngine:
    return LLMEngine(
        model,
        tokenizer,
        memory_budget_bytes=2**30,
        max_num_seqs=16,
        max_num_batched_tokens=256,
        max_model_len=MAX_MODEL_LEN,
    )


class LiveServer:
    """build_app over a loop stepping `engine` (built here, on the test's thread), served by uvicorn on a
    thread, on a port the OS picked."""

    def __init__(self, engine: LLMEngine, tokenizer, name: str = MODEL) -> None:
        self.engine = engine
        sock = listen("127.0.0.1", 0)
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        loop = EngineLoop(lambda: engine)
        loop.start()
        self.server = uvicorn.Server(uvicorn.Config(build_app(loop, tokenizer, name), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=120)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos_token_id: int) -> list[int]:
    """transformers' greedy continuation, ending at (and keeping) EOS as the engine does."""
    out = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
    )
    return out[0, len(prompt) :].tolist()


def hf_log_softmax(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) at each completion position [len(completion), vocab] (T = 1 for greedy)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / (temperature or 1.0), dim=-1)


def chat_ids(tokenizer, messages) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))


def expected_text(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def collect_stream(chunks, chat: bool):
    """The text, finish reason and logprob entries per choice index, and the usage chunk's usage."""
    texts, reasons, logprobs, usage = {}, {}, {}, None
    for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            piece = choice.delta.content if chat else choice.text
            texts[choice.index] = texts.get(choice.index, "") + (piece or "")
            if choice.finish_reason is not None:
                reasons[choice.index] = choice.finish_reason
            if choice.logprobs is not None:
                entries = choice.logprobs.content if chat else choice.logprobs.token_logprobs
                logprobs.setdefault(choice.index, []).extend(entries)
    return texts, reasons, logprobs, usage
