"""The engine against transformers on the real SmolLM2-135M-Instruct (fp32): greedy tokens on chat prompts
of mixed lengths, and sampled-token logprobs."""

import pytest
import torch

from rollout_engine import LLMEngine, SamplingParams

QUESTIONS = [
    "Hi!",
    "List the names of all employees hired after 2020 from the table employees(name, hired).",
    "What is 17 times 3?",
    "Write a SQL query that returns the number of orders per customer, largest first, from "
    "orders(id, customer_id, total) joined with customers(id, name).",
]


@pytest.fixture(scope="module")
def chat(smollm2):
    model, tok = smollm2
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)[
            "input_ids"
        ]
        for q in QUESTIONS
    ]
    engine = LLMEngine(
        model, tok, memory_budget_bytes=2**31, max_model_len=1024, max_num_seqs=32, max_num_batched_tokens=256
    )
    return model, tok, prompts, engine


def test_greedy_equals_hf_generate(chat):
    model, tok, prompts, engine = chat
    assert len({len(p) for p in prompts}) == 4
    results = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=24))
    for prompt, group in zip(prompts, results, strict=True):
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=24,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.eos_token_id,
        )
        assert group.samples[0].token_ids == out[0, len(prompt) :].tolist()
    assert engine.stats()["num_blocks_used"] == 0


def test_sampled_logprobs_equal_hf_forward(chat):
    model, _, prompts, engine = chat
    temperature = 0.8
    results = engine.generate(
        prompts[1:3], SamplingParams(n=2, temperature=temperature, max_tokens=16, seed=0)
    )
    for group in results:
        for sample in group.samples:
            ids = torch.tensor([group.prompt_token_ids + sample.token_ids])
            with torch.no_grad():
                logits = model(ids).logits[0, len(group.prompt_token_ids) - 1 : -1]
            expected = torch.log_softmax(logits / temperature, -1).gather(
                1, torch.tensor(sample.token_ids)[:, None]
            )
            torch.testing.assert_close(torch.tensor(sample.logprobs), expected.squeeze(1), atol=1e-4, rtol=0)


def test_stop_string_ends_the_completion_at_the_token_completing_it(chat):
    _, tok, prompts, engine = chat
    (free,) = engine.generate([prompts[2]], SamplingParams(temperature=0, max_tokens=16))
    ids = free.samples[0].token_ids
    stop = tok.decode(ids[4:6]).strip()
    assert stop
    first = next(k for k in range(len(ids)) if stop in tok.decode(ids[: k + 1]))
    (cut,) = engine.generate([prompts[2]], SamplingParams(temperature=0, max_tokens=16, stop=[stop]))
    assert cut.samples[0].token_ids == ids[: first + 1]
    assert cut.samples[0].finish_reason == "stop"
