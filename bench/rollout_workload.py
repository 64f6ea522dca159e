"""The GRPO rollout workload of bench/rollout.py, bench/rollout_vllm.py and bench/serve.py: chat prompts of
different lengths (or random ones of their lengths, for a random SmolLM2-shaped model), groups of samples at
temperature 1 run through the engine, and the options that size the workload."""

from __future__ import annotations

import argparse
import time

import torch
from decode_graphs import SHAPES
from transformers import AutoModelForCausalLM

from pagedrl_kernels.cpu_gemm import BF16_GEMMS
from rl.job.model_loading import DTYPES, resolve_device, resolve_dtype
from rollout_engine import LLMEngine, SamplingParams

TASKS = [
    "Say hello.",
    "What is the capital of France?",
    "Count the rows of the table users.",
    "Write a SQL query listing every customer whose name starts with A, sorted by name.",
    "Explain in two sentences what a LEFT JOIN does and when an INNER JOIN would drop rows instead.",
    "Given tables orders(id, customer_id, total, created_at) and customers(id, name, country), write a query "
    "returning the total spent per country in 2023, largest first.",
    "Is 91 a prime number?",
    "Translate 'good morning' into Spanish.",
    "Write a SQL query that finds the second highest salary in employees(id, name, salary, department_id), "
    "returning NULL when there is none, and explain why DISTINCT matters here.",
    "Name three sorting algorithms.",
    "The table events(id, user_id, kind, ts) logs clicks and views. Write a query giving, for each user, the "
    "ratio of clicks to views over the last 7 days, skipping users with no views, rounded to two decimals.",
    "What does GROUP BY do?",
    "Fix this query: SELECT name, COUNT(*) FROM people;",
    "Write a query joining products(id, name, price) and order_items(order_id, product_id, qty) that returns "
    "the ten best-selling products by revenue.",
    "Summarise the purpose of database indexes in one paragraph.",
    "Given schema: students(id, name), courses(id, title), enrolments(student_id, course_id, grade). Write a "
    "query returning each course title with its number of students and average grade, including courses "
    "nobody takes, and order the result by average grade descending with NULLs last.",
]


def chat_prompts(tokenizer, num_prompts: int) -> list[list[int]]:
    """The token ids of `num_prompts` chat prompts, one user turn each, the TASKS in turn."""
    messages = [[{"role": "user", "content": TASKS[i % len(TASKS)]}] for i in range(num_prompts)]
    return [
        tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True)["input_ids"]
        for m in messages
    ]


def random_model_and_prompts(
    num_prompts: int, seed: int, dtype: str
) -> tuple[torch.nn.Module, list[list[int]]]:
    """A seeded random SmolLM2-shaped model in `dtype` (a model.dtype value), and random prompts as long as
    the chat prompts would be."""
    torch.manual_seed(seed)
    config = SHAPES["smollm2_135m"]()
    device = resolve_device()
    torch_dtype = resolve_dtype(dtype, device).dtype
    model = AutoModelForCausalLM.from_config(config).to(device=device, dtype=torch_dtype).eval()
    lengths = [30 + len(TASKS[i % len(TASKS)]) // 4 for i in range(num_prompts)]  # template + ~4 chars/token
    gen = torch.Generator().manual_seed(seed)
    return model, [torch.randint(1, config.vocab_size, (n,), generator=gen).tolist() for n in lengths]


def pad_prompts(prompts: list[list[int]], num_tokens: int, vocab_size: int, seed: int) -> list[list[int]]:
    """Each prompt led by random token ids up to num_tokens in all (the training job's prompts are ~220)."""
    gen = torch.Generator().manual_seed(seed)
    pads = [torch.randint(1, vocab_size, (max(0, num_tokens - len(p)),), generator=gen) for p in prompts]
    return [pad.tolist() + p for pad, p in zip(pads, prompts, strict=True)]


def run_engine(engine: LLMEngine, prompts, group_size: int, max_tokens: int, seed: int, stop_token_ids=None):
    """(seconds, tokens generated) of one `generate` of group_size samples per prompt at temperature 1."""
    params = SamplingParams(
        n=group_size,
        temperature=1.0,
        top_p=1.0,
        top_k=-1,
        max_tokens=max_tokens,
        seed=seed,
        stop_token_ids=stop_token_ids,
    )
    start = time.perf_counter()
    results = engine.generate(prompts, params)
    seconds = time.perf_counter() - start
    return seconds, sum(len(s.token_ids) for r in results for s in r.samples)


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The workload's options, which bench/rollout.py and its peer benchmark bench/rollout_vllm.py share."""
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dtype", choices=["auto", *DTYPES], default="auto", help="model.dtype of our engine (and its model)"
    )
    parser.add_argument(
        "--bf16-gemm", choices=BF16_GEMMS, default="torch", help="the product of bf16 CPU projections"
    )
