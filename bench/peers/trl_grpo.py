"""TRL's arm of bench/grpo_step.py: GRPO steps with trl.GRPOTrainer on the tasks our arm drew.

    python bench/peers/trl_grpo.py REQUEST.json RESULT.json

Runs under a python with trl, peft and this project installed (the main venv with the `bench` extra; see
scripts/setup_bench_peers.sh). REQUEST holds the job's settings and, per step, the task rows our arm trained
on. TRL samples with transformers' `generate` (use_vllm=False) on LoRA through `peft_config`; the reward is
our SQL env's grade. TRL cannot pre-fill the assistant turn, so each prompt is the chat-templated text with
the env's response prefix appended, asserted to give our prompt's exact token ids. TRL's transformers path
passes no stop strings to `generate`, so (with stop="fence") every token containing one of the env's stop
strings ends a completion as an EOS would. One greedy generation warms TRL up before step 1, as our arm's
evaluation of one task warms our engine. RESULT gets per step: the wall time, the time inside `generate`,
the reward calls' time, and TRL's logged metrics.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import trl
from datasets import Dataset
from peft import LoraConfig
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from envs import make_env, start_episodes, step_episodes
from rl.job.model_loading import load_model
from rl.rollout.prompts import prompt_token_ids
from rl.sync.adapter import resolve_target_modules


class TimedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that adds up, per optimizer step, its time in sampling and in the reward functions."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.phase_seconds: dict[str, float] = defaultdict(float)

    def _generate_single_turn(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return super()._generate_single_turn(*args, **kwargs)
        finally:
            self.phase_seconds["generate"] += time.perf_counter() - start

    def _calculate_rewards(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return super()._calculate_rewards(*args, **kwargs)
        finally:
            self.phase_seconds["env"] += time.perf_counter() - start


class StepClock(TrainerCallback):
    """Wall time of each optimizer step (sampling, rewards, every micro-batch and the update), with the
    trainer's phase times of that step."""

    def __init__(self, trainer: TimedGRPOTrainer) -> None:
        self.trainer = trainer
        self.steps: list[dict[str, float]] = []
        self._start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self.trainer.phase_seconds.clear()
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        step_s = time.perf_counter() - self._start
        self.steps.append({"step": step_s, **self.trainer.phase_seconds})


def sql_reward(env, tasks: list[dict], response_prefix: str, timeout_s: float, graded: list[list[int]]):
    """A TRL reward function: the env's reward for each completion of the task in its `task_index`; each
    call appends the task indices it graded to `graded`."""

    def env_reward(prompts, completions, task_index, **kwargs) -> list[float]:
        graded.append(sorted(set(task_index)))
        episodes = start_episodes(env, [tasks[i] for i in task_index])
        actions = [response_prefix + completion for completion in completions]
        return [result.reward for result in step_episodes(episodes, actions, timeout_s=timeout_s)]

    return env_reward


def prompt_texts(tokenizer, env, tasks: list[dict]) -> list[str]:
    """Each task's chat-templated prompt with the response prefix appended; its tokens must be ours."""
    texts = []
    for task in tasks:
        messages = env.start(task).messages
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        text += env.response_prefix
        ours = prompt_token_ids(tokenizer, messages, env.response_prefix)
        assert tokenizer(text=[text])["input_ids"][0] == ours, (
            f"TRL's prompt tokens differ from ours: {text!r}"
        )
        texts.append(text)
    return texts


def warm_up(trainer: GRPOTrainer, prompt: str, max_tokens: int) -> None:
    """One greedy generation before step 1, as our arm's evaluation of one task warms its engine."""
    tokenizer = trainer.processing_class
    ids = tokenizer(text=[prompt], return_tensors="pt")["input_ids"].to(trainer.model.device)
    with torch.no_grad():
        trainer.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )


def stop_token_ids(tokenizer, stops: tuple[str, ...]) -> list[int]:
    """Every token whose text contains one of the stop strings."""
    return [
        index
        for piece, index in tokenizer.get_vocab().items()
        if any(stop in tokenizer.convert_tokens_to_string([piece]) for stop in stops)
    ]


def grpo_config(job: dict, output_dir: str) -> GRPOConfig:
    num_sequences = job["prompts_per_step"] * job["group_size"]  # a multiple of micro_batch_size
    return GRPOConfig(
        output_dir=output_dir,
        max_steps=job["num_steps"],
        per_device_train_batch_size=job["micro_batch_size"],
        gradient_accumulation_steps=num_sequences // job["micro_batch_size"],  # one generation per step
        num_generations=job["group_size"],
        max_completion_length=job["max_tokens"],
        temperature=job["temperature"],
        top_p=job["top_p"],
        top_k=max(job["top_k"], 0),  # ours -1 is TRL's 0: no top-k
        learning_rate=job["lr"],
        lr_scheduler_type=job["lr_schedule"],
        warmup_steps=job["warmup_steps"],
        weight_decay=job["weight_decay"],
        max_grad_norm=job["max_grad_norm"],
        optim="adamw_torch",
        beta=job["beta"],
        epsilon=job["eps_low"],
        epsilon_high=job["eps_high"],
        num_iterations=job["num_iterations"],
        loss_type=job["loss_type"],
        scale_rewards=job["scale"],
        mask_truncated_completions=job["mask_truncated_completions"],
        shuffle_dataset=False,  # the prompts in our arm's order
        use_vllm=False,
        gradient_checkpointing=False,  # TRL's default is on; ours is off
        bf16=False,  # no autocast: the model runs in the job's model.dtype, as ours does
        use_cpu=not torch.cuda.is_available(),
        seed=job["seed"],
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )


def main() -> None:
    request = json.loads(Path(sys.argv[1]).read_text())
    job = request["job"]
    torch.set_num_threads(request["threads"])
    torch.manual_seed(job["seed"])
    model, tokenizer = load_model(**job["model"])
    env = make_env(job["env_name"], **job["env_args"])
    if request["stop"] == "fence":
        model.generation_config.eos_token_id = [tokenizer.eos_token_id, *stop_token_ids(tokenizer, env.stop)]
    tasks = [task for step in request["steps"] for task in step]
    dataset = Dataset.from_dict(
        {"prompt": prompt_texts(tokenizer, env, tasks), "task_index": list(range(len(tasks)))}
    )
    lora = job["lora"]
    peft_config = LoraConfig(
        r=lora["rank"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=resolve_target_modules(lora["target_modules"]),
        use_rslora=lora["use_rslora"],
        bias="none",
        task_type="CAUSAL_LM",
    )
    graded: list[list[int]] = []
    reward = sql_reward(env, tasks, env.response_prefix, job["step_timeout_s"], graded)
    output_dir = Path(sys.argv[2]).parent / "trl_output"
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=grpo_config(job, str(output_dir)),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    clock = StepClock(trainer)
    trainer.add_callback(clock)
    warm_up(trainer, dataset[0]["prompt"], job["max_tokens"])
    trainer.train()
    per_step = job["prompts_per_step"]
    expected = [list(range(k * per_step, (k + 1) * per_step)) for k in range(job["num_steps"])]
    assert graded == expected, f"TRL's steps played the tasks {graded}, not our arm's {expected}"
    logs = [entry for entry in trainer.state.log_history if "step_time" in entry]
    steps = [
        {
            **times,
            "completion_mean_length": log["completions/mean_length"],
            "reward": log["reward"],
            "trl_step_time": log["step_time"],  # TRL's own: its training_step calls, without the update
        }
        for times, log in zip(clock.steps, logs, strict=True)
    ]
    result = {"steps": steps, "version": trl.__version__}
    Path(sys.argv[2]).write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
