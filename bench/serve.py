"""Serving throughput: generated tokens/s of 16 concurrent OpenAI clients against one client at a time, both
talking to `python train.py mode=serve` on SmolLM2-135M-Instruct.

The server runs as its own process, started with the command users run; the clients are threads of this one,
using the official `openai` client. Each arm sends the same --num-requests chat requests (the rollout bench's
prompts, bench/rollout.py), each sampled at temperature 1 with a seed of its own, up to --max-tokens tokens
or EOS. One client waits for each reply before it sends the next; the concurrent clients share the server's
engine steps (continuous batching). Tokens are the replies' usage.completion_tokens. Each arm's requests are
tagged with its name, so the second arm finds none of the first arm's prompts in the prefix cache; a warm-up
request goes first. Ends with one JSON line, with the CPU model and its vector ISA flags.

    python bench/serve.py                                  # 32 requests, up to 128 tokens (minutes, 2 cores)
    python bench/serve.py --num-requests 4 --max-tokens 4  # a quick check that it runs
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
from json_line import emit
from machine import cpu_description
from rollout_workload import TASKS

REPO = Path(__file__).resolve().parents[1]
MODEL = "smollm2_135m"


def start_server(threads: int, run_dir: Path) -> tuple[subprocess.Popen, str]:
    """`train.py mode=serve` on a free port, its output in run_dir/server.log; returns the process and its
    base URL once it serves."""
    command = [sys.executable, "train.py", "mode=serve", f"model={MODEL}", "serve.port=0"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    log = run_dir / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [*command, f"hydra.run.dir={run_dir}"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    while server.poll() is None:
        serving = [line for line in log.read_text().splitlines() if line.startswith("serving ")]
        if serving:
            return server, serving[0].split(" at ")[1]
        time.sleep(0.2)
    raise RuntimeError(
        f"the server exited with code {server.returncode} before it served:\n{log.read_text()}"
    )


def ask(base_url: str, arm: str, index: int, max_tokens: int) -> int:
    """One chat request; returns the tokens it generated."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    task = TASKS[index % len(TASKS)]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"({arm} {index}) {task}"}],
        max_tokens=max_tokens,
        temperature=1.0,
        seed=index,
    )
    return reply.usage.completion_tokens


def run_arm(
    base_url: str, arm: str, num_clients: int, num_requests: int, max_tokens: int
) -> tuple[int, float]:
    """All requests through num_clients clients at once; returns (tokens generated, seconds)."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=num_clients) as pool:
        tokens = list(pool.map(lambda i: ask(base_url, arm, i, max_tokens), range(num_requests)))
    return sum(tokens), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="the server's torch threads")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as run_dir:
        server, base_url = start_server(args.threads, Path(run_dir))
        try:
            ask(base_url, "warm-up", 0, 4)
            load = os.getloadavg()[0]
            one_tokens, one_s = run_arm(base_url, "one", 1, args.num_requests, args.max_tokens)
            many_tokens, many_s = run_arm(base_url, "many", args.clients, args.num_requests, args.max_tokens)
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=60)
    figures = {
        "one_client_tokens_per_s": one_tokens / one_s,
        "concurrent_tokens_per_s": many_tokens / many_s,
        "ratio": (many_tokens / many_s) / (one_tokens / one_s),
        "clients": args.clients,
        "one_client_tokens": one_tokens,
        "concurrent_tokens": many_tokens,
        "one_client_s": one_s,
        "concurrent_s": many_s,
        "num_requests": args.num_requests,
        "max_tokens": args.max_tokens,
        "model": MODEL,
        "threads": args.threads,
        "load_avg_1min": load,
        "load_avg_1min_end": os.getloadavg()[0],
        **cpu_description(),
    }
    print(f"{'':24}{'1 client':>12}{f'{args.clients} clients':>14}")
    print(f"{'generated tokens':24}{one_tokens:>12}{many_tokens:>14}")
    print(f"{'seconds':24}{one_s:>12.1f}{many_s:>14.1f}")
    one_rate, many_rate = figures["one_client_tokens_per_s"], figures["concurrent_tokens_per_s"]
    print(f"{'tokens / s':24}{one_rate:>12.1f}{many_rate:>14.1f}")
    print(f"concurrent / one client: {figures['ratio']:.2f}x")
    emit("serve", figures)


if __name__ == "__main__":
    main()
