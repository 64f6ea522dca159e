"""Two-process data parallel on gloo: torchrun runs this module as each rank's script (see `rank_main`).

Each rank trains the tiny model on the vowel plugin env (tests/helpers/plugin_envs.py) for two steps, then
records what it saw and ended with; the test compares the two ranks with each other and with independent
references.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train
from rl.config.schema import register_configs
from rl.eval.eval_sets import held_out_tasks
from rl.job import grpo_step as grpo_step_module
from rl.job import stages
from rl.job.distributed import (
    DistInfo,
    distributed,
    engine_memory_budget,
    init_distributed,
    rank_device,
    shard,
)
from rl.job.model_loading import load_model
from rl.report.metrics import combine_rank_metrics
from rl.sync.adapter import add_lora, lora_tensors
from rl.tasks.stream import TaskStream
from rollout_engine import SamplingParams
from tests.helpers.outcome_files import read_outcomes
from tests.helpers.plugin_envs import VOWELS, vowel_tasks
from tests.helpers.train_runs import compose_cfg

NUM_STEPS, PROMPTS_PER_RANK, WORLD_SIZE = 2, 2, 2
DDP = [
    f"num_steps={NUM_STEPS}",
    f"prompts_per_step={PROMPTS_PER_RANK}",
    "rollout.memory_budget_bytes=200000000",
    "rollout.max_num_seqs=16",
    *VOWELS,
]
PROMPT = [1, 520, 9531, 198, 4093, 17, 88]


def _questions(tasks) -> list[str]:
    return [task["question"] for task in tasks]


def rank_main(run_dir: Path, *overrides: str) -> None:
    """One rank: train under torchrun, then save what it saw and its weights to RUN_DIR/rank<r>.pt."""
    seen = {"train": [], "eval": [], "local_metrics": [], "checkpoints": 0, "loggers": 0}

    def start_episodes(env, tasks):  # collect_groups passes [task] * G, run_eval the rank's eval shard
        is_group = len({id(t) for t in tasks}) == 1 and len(tasks) > 1
        seen["train" if is_group else "eval"].append(_questions(tasks[:1] if is_group else tasks))
        return original["start_episodes"](env, tasks)

    def grpo_step(*args, **kwargs):
        metrics, trajectories = original["grpo_step"](*args, **kwargs)
        seen["local_metrics"].append(metrics)
        return metrics, trajectories

    def save_checkpoint(*args, **kwargs):
        seen["checkpoints"] += 1
        return original["save_checkpoint"](*args, **kwargs)

    def open_logger(*args, **kwargs):
        seen["loggers"] += 1
        return original["open_logger"](*args, **kwargs)

    def build_parts(*args, **kwargs):
        parts = original["build_parts"](*args, **kwargs)
        seen["initial"] = {k: v.clone() for k, v in lora_tensors(parts.model).items()}
        return parts

    hooks = dict(grpo_step=grpo_step, build_parts=build_parts)
    hooks.update(save_checkpoint=save_checkpoint, open_logger=open_logger)
    original = {name: getattr(train, name) for name in hooks}
    for name, hook in hooks.items():
        setattr(train, name, hook)
    original["start_episodes"] = grpo_step_module.start_episodes
    for module in (grpo_step_module, stages):  # collect_groups's groups, and the evaluations' shards
        module.start_episodes = start_episodes
    cfg = compose_cfg(run_dir, *DDP, *overrides)
    torch.manual_seed(cfg.seed)
    with distributed(cfg.model.device) as dist:  # as train.py's main does
        result = train.train(cfg, dist)
    greedy = SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[])
    sample = result.parts.engine.generate([PROMPT], greedy)[0].samples[0]
    seen.update(
        final={k: v.clone() for k, v in lora_tensors(result.parts.model).items()},
        engine_sample=(list(sample.token_ids), torch.tensor(sample.logprobs)),
        world_size=dist.world_size,
        train_model=type(result.parts.train_model).__name__,
    )
    torch.save(seen, run_dir / f"rank{dist.rank}.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(run_dir: Path, *overrides: str) -> list[dict]:
    """Run `rank_main` on WORLD_SIZE gloo ranks; returns what each rank saved."""
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={WORLD_SIZE}",
        "--master-addr=127.0.0.1", f"--master-port={_free_port()}", "-m", __name__, str(run_dir), *overrides,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return [torch.load(run_dir / f"rank{r}.pt", weights_only=False) for r in range(WORLD_SIZE)]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ddp")
    ranks = torchrun(run_dir)
    register_configs()
    return run_dir, ranks, compose_cfg(run_dir, *DDP)


def test_both_ranks_end_with_the_same_trained_lora_weights(ddp_run):
    _, (r0, r1), _ = ddp_run
    assert r0["world_size"] == r1["world_size"] == WORLD_SIZE
    assert r0["train_model"] == r1["train_model"] == "DistributedDataParallel"
    assert r0["final"].keys() == r1["final"].keys()
    assert all(torch.equal(r0["final"][name], r1["final"][name]) for name in r0["final"])
    moved = [name for name in r0["final"] if not torch.equal(r0["final"][name], r0["initial"][name])]
    assert any(name.endswith("lora_B") for name in moved)  # peft starts B at zero: the updates reached it


def test_ranks_split_each_global_batch_and_walk_the_same_stream(ddp_run):
    run_dir, ranks, cfg = ddp_run
    stream = TaskStream(vowel_tasks()["train"], seed=cfg.seed)
    for step in range(NUM_STEPS):
        global_batch = _questions(stream.next_batch(PROMPTS_PER_RANK * WORLD_SIZE))
        per_rank = [[q[0] for q in rank["train"][step * PROMPTS_PER_RANK : (step + 1) * PROMPTS_PER_RANK]]
                    for rank in ranks]  # fmt: skip
        assert not set(per_rank[0]) & set(per_rank[1])
        assert sorted(per_rank[0] + per_rank[1]) == sorted(global_batch)
    state = json.loads(next((run_dir / "checkpoints").glob(f"step_{NUM_STEPS}/state.json")).read_text())
    assert state["data_position"]["index"] == NUM_STEPS * PROMPTS_PER_RANK * WORLD_SIZE  # 32 tasks: epoch 0
    # the held-out set (4 tasks) is split too: each evaluation sees two per rank, all four together
    held_out = _questions(held_out_tasks(vowel_tasks()["test"], 4, cfg.seed))
    for eval_0, eval_1 in zip(ranks[0]["eval"], ranks[1]["eval"], strict=True):
        assert len(eval_0) == len(eval_1) == 2 and sorted(eval_0 + eval_1) == sorted(held_out)
    # rank 0 gathers both shards' outcomes and writes them in the held-out set's own order
    outcomes = read_outcomes(run_dir / "evals" / f"held_out_grpo_{NUM_STEPS}.jsonl")
    assert [o["question"] for o in outcomes] == held_out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_accuracy"] == sum(o["success"] for o in outcomes) / len(outcomes)


def test_rank_zero_alone_logs_and_checkpoints_the_combined_metrics(ddp_run):
    run_dir, (r0, r1), _ = ddp_run
    assert (r0["loggers"], r0["checkpoints"]) == (1, NUM_STEPS)
    assert (r1["loggers"], r1["checkpoints"]) == (0, 0)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "policy_loss" in r]
    assert [r["step"] for r in steps] == list(range(1, NUM_STEPS + 1))  # once each: rank 1 wrote nothing
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_1", "step_2"]
    for record, local_0, local_1 in zip(steps, r0["local_metrics"], r1["local_metrics"], strict=True):
        for name in ("reward", "reward_std", "frac_reward_zero_std", "policy_loss"):
            assert record[name] == pytest.approx((local_0[name] + local_1[name]) / 2, rel=1e-6)
        throughput = local_0["rollout/tokens_per_s"] + local_1["rollout/tokens_per_s"]
        assert record["rollout/tokens_per_s"] == pytest.approx(throughput, rel=1e-6)
    assert r0["local_metrics"][0]["reward"] != r1["local_metrics"][0]["reward"]  # so the mean is a real check


def test_each_engine_samples_from_its_ranks_trained_weights(ddp_run, causal_lm_logprobs):
    run_dir, ranks, cfg = ddp_run
    model, _ = load_model("tiny_llama", seed=cfg.model.seed, dtype=cfg.model.dtype.value)
    model = add_lora(model, cfg.lora.rank, cfg.lora.alpha, target_modules=cfg.lora.target_modules).eval()
    for rank in ranks:
        for name, tensor in lora_tensors(model).items():
            tensor.copy_(rank["final"][name])
        token_ids, engine_logprobs = rank["engine_sample"]
        expected = causal_lm_logprobs(model, PROMPT, token_ids)
        assert torch.allclose(engine_logprobs, expected, atol=1e-4)
        with model.disable_adapter():
            assert not torch.allclose(causal_lm_logprobs(model, PROMPT, token_ids), expected, atol=1e-4)


@pytest.mark.slow
def test_every_rank_resumes_from_rank_zeros_checkpoint_as_if_never_stopped(ddp_run, tmp_path):
    run_dir, straight, _ = ddp_run
    shutil.copytree(run_dir / "checkpoints" / "step_1", tmp_path / "checkpoints" / "step_1")
    (tmp_path / "checkpoints" / "latest").write_text("step_1")
    resumed = torchrun(tmp_path, "resume=true")
    assert [len(rank["local_metrics"]) for rank in resumed] == [1, 1]  # only step 2 ran
    for before, after in zip(straight, resumed, strict=True):
        assert after["train"] == before["train"][PROMPTS_PER_RANK:]  # the same step-2 prompts per rank
        assert after["local_metrics"][0]["policy_loss"] == before["local_metrics"][1]["policy_loss"]
        assert all(torch.equal(after["final"][name], before["final"][name]) for name in before["final"])


def test_a_transfer_set_is_sharded_over_the_ranks_and_written_whole_in_its_order(tmp_path):
    # 5 tasks over 2 ranks: shards of 3 and 2, gathered back into the sample's order by rank 0
    transfer = ["+transfer.tasks._target_=e2e_vowel_env.vowel_tasks", "transfer.eval_tasks=5"]
    ranks = torchrun(tmp_path, *transfer)
    sample = _questions(held_out_tasks(vowel_tasks()["test"], 5, 0))
    summary = json.loads((tmp_path / "summary.json").read_text())
    for name in ("transfer_base_0", f"transfer_grpo_{NUM_STEPS}"):
        outcomes = read_outcomes(tmp_path / "evals" / f"{name}.jsonl")
        assert [o["question"] for o in outcomes] == sample
    assert summary["transfer_num_tasks"] == 5
    assert summary["transfer_final_accuracy"] == sum(o["success"] for o in outcomes) / 5
    mean_reward = sum(o["reward"] for o in outcomes) / 5
    assert summary["eval_history"][-1]["transfer_reward"] == pytest.approx(mean_reward)
    assert [len(q) for q in ranks[0]["eval"]] == [2, 3, 2, 3]  # held-out 4 and transfer 5, twice
    assert [len(q) for q in ranks[1]["eval"]] == [2, 2, 2, 2]


def test_rank_metrics_combine_by_meaning():
    per_rank = [
        {"reward": 0.2, "rollout/tokens_per_s": 100.0, "time/train": 3.0, "rewards/vowels": 0.4},
        {"reward": 0.6, "rollout/tokens_per_s": 50.0, "time/train": 5.0, "completions/min_length": 4.0},
    ]
    assert combine_rank_metrics(per_rank) == {
        "reward": pytest.approx(0.4),
        "rollout/tokens_per_s": 150.0,
        "time/train": 5.0,
        "rewards/vowels": pytest.approx(0.2),  # rank 1's episodes scored 0 on it
        "completions/min_length": 4.0,
    }


def test_shards_interleave_and_cover_the_items():
    items = list(range(7))
    parts = [shard(items, DistInfo(rank=r, world_size=3)) for r in range(3)]
    assert parts == [[0, 3, 6], [1, 4], [2, 5]]


def test_cpu_ranks_of_a_node_split_the_engines_ram_budget():
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert engine_memory_budget(None, "cpu", local_world_size=2) == ram // 2
    assert engine_memory_budget(None, "cpu", local_world_size=1) is None  # the engine reads RAM itself
    assert engine_memory_budget(10**8, "cpu", local_world_size=2) == 10**8  # a set budget is per rank
    assert engine_memory_budget(None, "cuda:1", local_world_size=2) is None  # each GPU is its rank's own


def test_outside_torchrun_the_run_is_single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert init_distributed("cpu") == DistInfo(device="cpu")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE='two' is not an integer.*torchrun"):
        init_distributed("cpu")


def test_a_pinned_device_is_refused_under_torchrun():
    with pytest.raises(ValueError, match="model.device=cuda:0 pins one device.*model.device=auto"):
        rank_device("cuda:0", local_rank=1)
    assert rank_device("cpu", local_rank=1) == "cpu"


if __name__ == "__main__":
    rank_main(Path(sys.argv[1]), *sys.argv[2:])
