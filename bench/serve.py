"""Serving throughput against the engine the server wraps: generated tokens/s of `python train.py mode=serve`
on SmolLM2-135M-Instruct, one client and --clients at once, each beside the same requests run by the engine
in this process, with no HTTP.

Four arms, each of the same --num-requests requests (the rollout bench's tasks, bench/rollout_workload.py),
sampled at temperature 1 with a seed of its own (the request's index), up to --max-tokens tokens or EOS:
- **server, 1 client**: `/v1/completions` streamed (`stream=True`) by the official `openai` client, one
  request after another; its tokens are the stream's usage.completion_tokens (`include_usage`);
- **engine, 1 sequence**: the same requests, one after another, stepped by the engine alone;
- **server, N clients**: `/v1/chat/completions` (not streamed) from --clients client threads at once, which
  share the server's engine steps (continuous batching); tokens are the replies' usage.completion_tokens;
- **engine, N sequences**: the same requests stepped together, at most --clients in flight as the server
  sees them (the next one joins the batch at the step after one ends).
The engine's requests are what the server makes of the same bodies (serve/app.py's `Server.completion` and
`Server.chat`: its tokenization of the prompt, its chat template, its SamplingParams), so each engine arm
runs the token ids and settings of its server arm. The engine is built as mode=serve builds it
(rl/job/modes.py's `serving_engine` on the same overrides: model, dtype, no LoRA) after the server has
stopped, so the two never compute at once, at the server's torch thread count (--threads), and stepped on the
thread that built it, as the server's loop thread does (serve/engine_loop.py). The 1-client and
N-client requests are tagged "one" and "many" in their prompts, so neither finds the other's prompts in the
prefix cache; a warm-up request goes first on each side. Prints each server arm's share of its engine arm's
rate (targets: 60% for one client, 80% for N) and ends with one JSON line, with the CPU model and its vector
ISA flags.

    python bench/serve.py                              # 32 requests, up to 128 tokens (minutes, 2 cores)
    python bench/serve.py --num-requests 2 --max-tokens 4 --clients 2   # a quick check that it runs
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import torch
from hydra import compose, initialize_config_dir
from json_line import emit
from machine import cpu_description
from omegaconf import DictConfig
from rollout_workload import TASKS

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the serve package before this file, which has its name
from rl.config.schema import register_configs  # noqa: E402
from rl.job.modes import serving_engine, serving_name  # noqa: E402
from rollout_engine import LLMEngine, SamplingParams  # noqa: E402
from serve.app import Server  # noqa: E402
from serve.engine_loop import EngineLoop  # noqa: E402

MODEL = "smollm2_135m"
OVERRIDES = ["mode=serve", f"model={MODEL}"]  # the server's and the engine arms' config
TARGETS = {"one": 0.6, "many": 0.8}  # server / engine tokens/s


def completion_body(arm: str, index: int, max_tokens: int) -> dict:
    """Request `index` of an arm as a streamed /v1/completions body: the task as plain text."""
    return {
        "model": MODEL,
        "prompt": f"({arm} {index}) {TASKS[index % len(TASKS)]}",
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": index,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def chat_body(arm: str, index: int, max_tokens: int) -> dict:
    """Request `index` of an arm as a /v1/chat/completions body: the task as one user turn."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"({arm} {index}) {TASKS[index % len(TASKS)]}"}],
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": index,
    }


def start_server(threads: int, run_dir: Path) -> tuple[subprocess.Popen, str]:
    """`train.py mode=serve` on a free port, its output in run_dir/server.log; returns the process and its
    base URL once it serves."""
    command = [sys.executable, "train.py", *OVERRIDES, "serve.port=0"]
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


def send(base_url: str, body: dict) -> int:
    """One request to the server, its stream read to the end; returns the tokens it generated."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    if "prompt" in body:
        usage = [chunk.usage for chunk in client.completions.create(**body) if chunk.usage is not None]
        return usage[-1].completion_tokens
    return client.chat.completions.create(**body).usage.completion_tokens


def run_server_arm(base_url: str, bodies: list[dict], num_clients: int) -> tuple[int, float]:
    """All requests through num_clients clients at once; returns (tokens generated, seconds)."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=num_clients) as pool:
        tokens = list(pool.map(lambda body: send(base_url, body), bodies))
    return sum(tokens), time.perf_counter() - start


def serving_config(run_dir: str) -> DictConfig:
    """The config `train.py` composes for the server's command line."""
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("train", overrides=[*OVERRIDES, f"run_dir={run_dir}", "logger.wandb.mode=disabled"])


def engine_requests(server: Server, bodies: list[dict]) -> list[tuple[list[int], SamplingParams]]:
    """What the server hands its engine for each body: the prompt's token ids and the sampling params."""
    replies = [server.completion(body) if "prompt" in body else server.chat(body) for body in bodies]
    return [(reply.prompts[0], reply.params) for reply in replies]


def run_engine_arm(
    engine: LLMEngine, requests: list[tuple[list[int], SamplingParams]], in_flight: int
) -> tuple[int, float]:
    """The requests stepped by the engine, at most in_flight at once; returns (tokens generated, seconds)."""
    waiting, running, tokens = list(reversed(requests)), 0, 0
    start = time.perf_counter()
    while waiting or engine.has_unfinished():
        while waiting and running < in_flight:
            engine.add_request(*waiting.pop())
            running += 1
        for group in engine.step().finished:
            running -= 1
            tokens += sum(len(sample.token_ids) for sample in group.samples)
    return tokens, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the server and the engine")
    args = parser.parse_args()
    # arm -> (the maker of its requests' bodies, clients or sequences in flight)
    arms: dict[str, tuple[Callable[[str, int, int], dict], int]] = {
        "one": (completion_body, 1),
        "many": (chat_body, args.clients),
    }
    bodies = {
        arm: [make(arm, i, args.max_tokens) for i in range(args.num_requests)]
        for arm, (make, _) in arms.items()
    }
    warm_up = chat_body("warm-up", 0, 4)
    results = {}
    with tempfile.TemporaryDirectory() as run_dir:
        server, base_url = start_server(args.threads, Path(run_dir))
        try:
            send(base_url, warm_up)
            load = os.getloadavg()[0]
            for arm, (_, in_flight) in arms.items():
                results[f"server_{arm}"] = run_server_arm(base_url, bodies[arm], in_flight)
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=60)
        torch.set_num_threads(args.threads)
        cfg = serving_config(run_dir)
        engine = serving_engine(cfg)
    loop = EngineLoop(lambda: engine)  # only to turn bodies into requests: it is never handed one
    loop.start()
    translate = Server(loop, engine.tokenizer, serving_name(cfg))
    run_engine_arm(engine, engine_requests(translate, [warm_up]), 1)
    for arm, (_, in_flight) in arms.items():
        results[f"engine_{arm}"] = run_engine_arm(engine, engine_requests(translate, bodies[arm]), in_flight)
    loop.stop()

    rates = {key: tokens / seconds for key, (tokens, seconds) in results.items()}
    figures = {f"{key}_tokens_per_s": rate for key, rate in rates.items()}
    figures |= {f"{arm}_ratio": rates[f"server_{arm}"] / rates[f"engine_{arm}"] for arm in arms}
    figures |= {f"{key}_tokens": tokens for key, (tokens, _) in results.items()}
    figures |= {f"{key}_s": seconds for key, (_, seconds) in results.items()}
    figures |= {
        "clients": args.clients,
        "num_requests": args.num_requests,
        "max_tokens": args.max_tokens,
        "model": MODEL,
        "threads": args.threads,
        "load_avg_1min": load,
        "load_avg_1min_end": os.getloadavg()[0],
        **cpu_description(),
    }
    names = {
        "server_one": "server, 1 client (streaming completions)",
        "engine_one": "engine, 1 sequence",
        "server_many": f"server, {args.clients} clients (chat)",
        "engine_many": f"engine, {args.clients} sequences",
    }
    print(f"{'':44}{'tokens':>8}{'seconds':>10}{'tokens / s':>12}")
    for key, label in names.items():
        tokens, seconds = results[key]
        print(f"{label:44}{tokens:>8}{seconds:>10.1f}{rates[key]:>12.1f}")
    for arm, label in (("one", "1 client"), ("many", f"{args.clients} clients")):
        print(f"server / engine, {label}: {figures[f'{arm}_ratio']:.0%} (target >= {TARGETS[arm]:.0%})")
    emit("serve", figures)


if __name__ == "__main__":
    main()
