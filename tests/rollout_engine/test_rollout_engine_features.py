"""Engine features on a tiny random Llama: GRPO group sharing, chunked prefill, preemption under a
tight KV budget, the prefix cache and its policy reset, multi-turn continuation, and no leaked blocks."""

import pytest
import torch

from pagedrl_kernels.cpu_gemm import HAS_MKL_PACKING
from rollout_engine import SamplingParams
from rollout_engine.memory import activation_bytes, kv_bytes_per_block
from tests.helpers.rollout_tiny_models import (
    LLAMA_PACKED_BYTES,
    hf_greedy,
    make_engine,
    make_tiny_model,
    random_prompts,
)

# the CPU engine's budget also holds its packed copies of the weights
PACKED_BYTES = LLAMA_PACKED_BYTES if HAS_MKL_PACKING else 0

GREEDY = SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[])


@pytest.fixture(scope="module")
def llama():
    return make_tiny_model("llama", seed=2)


def test_group_of_8_shares_prompt_blocks(llama):
    engine = make_engine(llama, block_size=4)
    bm = engine.block_manager
    prompt = random_prompts([10])[0]  # 2 full blocks + a partial one
    engine.add_request(prompt, SamplingParams(n=8, temperature=1.0, max_tokens=6, seed=0, stop_token_ids=[]))
    engine.step()  # prefill once, then fork into 8 samples
    group = engine.scheduler.running
    assert len(group) == 8
    prompt_blocks = group[0].block_table
    assert len(prompt_blocks) == 3 and all(seq.block_table == prompt_blocks for seq in group)
    assert [bm.ref_counts[b] for b in prompt_blocks] == [8, 8, 8]
    assert engine.stats()["num_blocks_used"] == 3 and engine.stats()["num_blocks_shared"] == 3
    engine.step()  # every sample writes its first token into the partial block: 7 copies on write
    assert all(seq.block_table[:2] == prompt_blocks[:2] for seq in group)
    assert len({seq.block_table[2] for seq in group}) == 8
    assert [bm.ref_counts[b] for b in prompt_blocks[:2]] == [8, 8]
    while engine.has_unfinished():
        engine.step()
    # 10 + 6 tokens, the last one never cached: ceil(15 / 4) = 4 blocks per sample, 2 of them shared.
    assert engine.stats()["num_blocks_peak"] == 2 + 8 * 2 < 8 * 4
    assert engine.stats()["num_blocks_saved_by_sharing"] == 7 * 2
    assert engine.stats()["num_blocks_used"] == 0


def test_chunked_prefill_gives_the_same_next_token_logits(llama):
    prompt = random_prompts([45], seed=1)[0]
    logits = {}
    for budget in (64, 8):
        engine = make_engine(llama, max_num_batched_tokens=budget, max_num_seqs=8)
        steps = []
        run = engine.runner.run
        engine.runner.run = lambda inputs, run=run, steps=steps: steps.append(run(inputs)) or steps[-1]
        engine.generate([prompt], SamplingParams(temperature=0, max_tokens=1, stop_token_ids=[]))
        assert engine.stats()["num_prefill_tokens"] == 45
        # Only the step that completes the prompt returns a logits row.
        assert [len(step) for step in steps] == [0] * (len(steps) - 1) + [1]
        assert len(steps) == -(-45 // budget)
        logits[budget] = steps[-1]
    with torch.no_grad():
        hf = llama(torch.tensor([prompt])).logits[0, -1]
    torch.testing.assert_close(logits[8][0], logits[64][0], atol=1e-5, rtol=0)
    torch.testing.assert_close(logits[8][0], hf, atol=1e-4, rtol=0)


def test_preemption_under_a_tight_budget_keeps_greedy_outputs(llama):
    prompts = random_prompts([14, 9, 21, 5, 17, 12], seed=2)
    params = SamplingParams(n=2, temperature=0, max_tokens=24, stop_token_ids=[])
    ample = make_engine(llama).generate(prompts, params)
    # 20 blocks of 4 tokens: room for one max_model_len=64 sequence, far from the ~100 blocks all need.
    per_block = kv_bytes_per_block(2, 4, 2, 16, torch.float32)
    budget = activation_bytes(64, 16, 64, 128, 256, torch.float32) + PACKED_BYTES + 20 * per_block
    tight = make_engine(llama, memory_budget_bytes=budget, memory_fraction=1.0, max_model_len=64)
    assert tight.stats()["num_blocks_total"] == 20
    results = tight.generate(prompts, params)
    assert tight.stats()["num_preemptions"] > 0
    for prompt, a, b in zip(prompts, ample, results, strict=True):
        assert [s.token_ids for s in a.samples] == [s.token_ids for s in b.samples]
        assert b.samples[0].token_ids == hf_greedy(llama, prompt, 24)
    assert tight.stats()["num_blocks_used"] == 0


def test_prefix_cache_hit_skips_prefill_and_reset_makes_blocks_unreachable(llama):
    system = random_prompts([16], seed=3)[0]  # 4 full blocks shared by both requests
    first, second = system + [1, 2, 3], system + [7, 8]
    engine = make_engine(llama)
    engine.generate([first], GREEDY)
    prefilled = engine.stats()["num_prefill_tokens"]
    (hit,) = engine.generate([second], GREEDY)
    stats = engine.stats()
    assert stats["prefix_cache_hits"] == 4
    assert stats["num_prefill_tokens"] - prefilled == 2  # only the tokens after the shared blocks
    assert hit.samples[0].token_ids == hf_greedy(llama, second, 10)
    engine.reset_prefix_cache()
    (miss,) = engine.generate([second], GREEDY)
    assert engine.stats()["prefix_cache_hits"] == 4
    assert engine.stats()["num_prefill_tokens"] - stats["num_prefill_tokens"] == len(second)
    assert miss.samples[0].token_ids == hit.samples[0].token_ids
    assert engine.stats()["num_blocks_used"] == 0


def test_prompts_sent_together_compute_their_shared_prefix_once(llama):
    system = random_prompts([16], seed=4)[0]  # 4 full blocks of a common prefix
    prompts = [system + tail for tail in random_prompts([5, 9, 3], seed=5)]
    engine = make_engine(llama)
    outputs = engine.generate(prompts, GREEDY)
    stats = engine.stats()
    assert stats["prefix_cache_hits"] == 2 * 4  # the second and third prompts wait for the first's blocks
    assert stats["num_prefill_tokens"] == 16 + 5 + 9 + 3
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.samples[0].token_ids == hf_greedy(llama, prompt, 10)
    assert stats["num_blocks_used"] == 0


def test_stale_kv_is_not_reused_after_a_weight_update():
    model = make_tiny_model("llama", seed=4)
    prompt = random_prompts([20], seed=4)[0]
    engine = make_engine(model)
    engine.generate([prompt], GREEDY)
    with torch.no_grad():
        model.model.layers[0].self_attn.v_proj.weight.mul_(2.0)
    engine.reset_prefix_cache()
    (group,) = engine.generate([prompt], GREEDY)
    assert engine.stats()["prefix_cache_hits"] == 0
    assert group.samples[0].token_ids == hf_greedy(model, prompt, 10)


def test_continuation_equals_prefilling_the_whole_conversation(llama):
    prompts = random_prompts([13, 22], seed=5)
    engine = make_engine(llama)
    turn1 = engine.generate(
        prompts, SamplingParams(n=2, temperature=1.0, max_tokens=9, seed=3, stop_token_ids=[])
    )
    env_tokens = [40, 41, 42]
    for group in turn1:
        for sample in group.samples:
            before = engine.stats()["num_prefill_tokens"]
            conversation = sample.prompt_token_ids + sample.token_ids + env_tokens
            turn2 = engine.generate([conversation], GREEDY)[0].samples[0]
            # Earlier turns keep their full blocks; at most the last partial block, the last
            # sampled token and the new tokens are prefilled.
            assert engine.stats()["num_prefill_tokens"] - before <= 3 + 4
            scratch = make_engine(llama).generate([conversation], GREEDY)[0].samples[0]
            assert turn2.token_ids == scratch.token_ids == hf_greedy(llama, conversation, 10)
    assert engine.stats()["num_blocks_used"] == 0


def test_a_large_decode_batch_matches_hf(llama):
    prompts = random_prompts([3, 30, 11, 22, 7], seed=6)
    engine = make_engine(llama, max_num_seqs=64)
    item_counts = []
    prepare = engine.runner.prepare
    engine.runner.prepare = lambda items, rows: item_counts.append(len(items)) or prepare(items, rows)
    results = engine.generate(prompts, SamplingParams(n=8, temperature=0, max_tokens=8, stop_token_ids=[]))
    assert max(item_counts) == 40  # the 5 groups of 8 decode in one step
    for prompt, group in zip(prompts, results, strict=True):
        expected = hf_greedy(llama, prompt, 8)
        assert all(sample.token_ids == expected for sample in group.samples)


def test_on_finished_hears_each_prompt_once_as_its_samples_finish(llama):
    """Prompts that finish at different steps (max_tokens 2, 6 and 4) are reported in the order they end,
    each by its index in the call, before generate returns."""
    engine = make_engine(llama)
    prompts = random_prompts([5, 7, 9], seed=4)
    params = [
        SamplingParams(n=n, temperature=0, max_tokens=m, stop_token_ids=[])
        for n, m in [(2, 2), (1, 6), (3, 4)]
    ]
    heard = []
    results = engine.generate(
        prompts, params, on_finished=lambda i: heard.append((i, engine.has_unfinished()))
    )
    assert heard == [(0, True), (2, True), (1, False)]
    assert [len(r.samples) for r in results] == [2, 1, 3]
