"""placement=process: an engine in a rollout-worker process follows the trainer's LoRA pushes over gloo."""

import torch

from rl.job.model_loading import load_model, smollm2_checkpoint_dir
from rl.job.rollout_worker import DistributedSync, RemoteEngine, build_worker
from rl.sync.adapter import add_lora, lora_tensors
from rollout_engine import SamplingParams

MODEL = dict(name="tiny_llama", seed=3, dtype="float32")
LORA = dict(rank=4, alpha=8.0, target_modules="all")
ENGINE = dict(
    block_size=4, memory_budget_bytes=2**26, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=128
)


def test_worker_engine_gives_the_trainers_logprobs_after_each_push(causal_lm_logprobs):
    smollm2_checkpoint_dir()  # the tokenizer the worker loads is converted once, here, not in the worker
    model, _ = load_model(**MODEL)
    model = add_lora(model, **LORA).eval()
    prompt = [1, 17, 300, 4000, 25, 9]
    greedy = SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[])
    heard = []  # a caller's progress: every prompt once the call is back
    # 4 KiB buckets: the larger LoRA tensors span several buckets
    with DistributedSync(build_worker, (MODEL, LORA, ENGINE), bucket_bytes=4096, timeout_s=60) as sync:
        remote = RemoteEngine(sync)
        for version in (1, 2, 3):
            gen = torch.Generator().manual_seed(version)
            with torch.no_grad():
                for tensor in lora_tensors(model).values():
                    tensor.copy_(torch.randn(tensor.shape, generator=gen) * 0.3)
            sync.push(lora_tensors(model), version)
            (group,) = remote.generate([prompt], greedy, on_finished=heard.append)
            sample = group.samples[0]
            expected = causal_lm_logprobs(model, prompt, sample.token_ids)
            assert torch.allclose(torch.tensor(sample.logprobs), expected, atol=1e-4)
            assert len(sample.token_ids) == 6
    assert heard == [0, 0, 0]


def test_reset_prefix_cache_empties_the_worker_engines_prefix_cache():
    """A prompt's second play reuses the first's KV blocks in the worker; after reset_prefix_cache its third
    play finds none cached and prefills the whole prompt again."""
    smollm2_checkpoint_dir()
    prompt = [1, 17, 300, 4000, 25, 9, 88, 520, 7]  # two full blocks of 4, then one token
    greedy = SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[])
    with DistributedSync(build_worker, (MODEL, LORA, ENGINE), timeout_s=60) as sync:
        remote = RemoteEngine(sync)
        remote.generate([prompt], greedy)
        first = remote.stats()
        remote.generate([prompt], greedy)
        second = remote.stats()
        assert second["prefix_cache_hits"] - first["prefix_cache_hits"] == 2
        assert second["num_prefill_tokens"] - first["num_prefill_tokens"] == 1
        remote.reset_prefix_cache()
        remote.generate([prompt], greedy)
        third = remote.stats()
        assert third["prefix_cache_hits"] == second["prefix_cache_hits"]
        assert third["num_prefill_tokens"] - second["num_prefill_tokens"] == len(prompt)
