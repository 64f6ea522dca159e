"""The held-out evaluation hands the engine's KV memory back: its prompts are never trained on, so their
cached blocks are dropped and, on the CPU, their pages return to the system before the trainer's next step."""

import sys

import pytest

from envs import BaseEnv, StepResult, start_episodes, step_episodes
from rl.eval.evaluate import play_eval
from rl.job.model_loading import load_model
from rl.rollout.play import play_groups
from rollout_engine import LLMEngine, SamplingParams


class EchoEnv(BaseEnv):
    max_turns = 1

    def start(self, task):
        return EchoEpisode(task["question"])


class EchoEpisode:
    max_turns = 1

    def __init__(self, question):
        self.messages = [{"role": "user", "content": question}]

    def step(self, action):
        return StepResult(None, float("a" in action), True)


@pytest.mark.skipif(sys.platform != "linux", reason="resident KV pages are counted with mincore")
def test_evaluation_drops_its_cached_kv_and_gives_the_memory_back():
    model, tokenizer = load_model("tiny_llama", dtype="float32", device="cpu")
    engine = LLMEngine(model, tokenizer, memory_budget_bytes=2**30, max_model_len=256)
    env = EchoEnv()
    tasks = [{"question": f"Name a fruit that starts with the letter {c}."} for c in "abcdefgh"]
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=16)
    play_groups(engine, tokenizer, [[e] for e in start_episodes(env, tasks)], greedy, step_episodes, 64)
    stats = engine.stats()
    assert stats["kv_bytes_resident"] > 0 and stats["num_blocks_used"] == 0  # cached, not in use
    hits = stats["prefix_cache_hits"]

    outcomes = play_eval(engine, tokenizer, env, tasks, greedy, step_episodes, start_episodes, 64, labels=())
    assert len(outcomes) == len(tasks)
    stats = engine.stats()
    assert stats["prefix_cache_hits"] > hits  # the evaluation itself still reused the cached prompts
    assert stats["kv_bytes_resident"] == 0
