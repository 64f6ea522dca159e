"""Checkpoints: exact round trips, resume equal to an uninterrupted run, and saves that survive kills."""

import contextlib
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model

from rl.job import checkpoint
from rl.job.checkpoint import RunDirError, check_run_dir, find_latest, load_checkpoint, save_checkpoint
from tests.helpers.lora_training import (
    LORA,
    VOCAB,
    lora_state,
    optimizer_and_scheduler,
    seed_all,
    tiny_lora_model,
    train_step,
)
from tests.helpers.tiny_models import tiny_llama

CONFIG_YAML = "trainer:\n  lr: 0.01\nalgo:\n  group_size: 4\n"
REPO = Path(__file__).resolve().parents[2]


def trained(num_steps: int, device: str = "cpu"):
    seed_all(0)
    model = tiny_lora_model(device=device)
    optimizer, scheduler = optimizer_and_scheduler(model)
    losses = [train_step(model, optimizer, scheduler) for _ in range(num_steps)]
    return model, optimizer, scheduler, losses


def rng_draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3)


def crash(*args):
    raise OSError("disk vanished")


def assert_same_weights(expected: dict, model, exact: bool = True) -> None:
    actual = lora_state(model)
    assert actual.keys() == expected.keys()
    for name, tensor in expected.items():
        # CUDA kernels may reorder reductions between runs; a wrong dropout mask still shows as a large error
        torch.testing.assert_close(actual[name], tensor, rtol=0 if exact else 1e-5, atol=0 if exact else 1e-6)


def test_save_mutate_load_restores_weights_optimizer_scheduler_and_rng(tmp_path):
    model, optimizer, scheduler, _ = trained(2)
    params_before = [id(p) for p in model.parameters()]
    path = save_checkpoint(tmp_path, 2, model, optimizer, scheduler, {"epoch": 0, "index": 16}, CONFIG_YAML)
    assert path == tmp_path / "checkpoints" / "step_2"
    saved_weights = lora_state(model)
    saved_adam = {i: {k: v.clone() for k, v in s.items()} for i, s in optimizer.state_dict()["state"].items()}
    saved_lr = scheduler.get_last_lr()
    draws = rng_draws()

    for _ in range(2):  # mutate everything the checkpoint holds
        train_step(model, optimizer, scheduler)
    assert not torch.equal(next(iter(lora_state(model).values())), next(iter(saved_weights.values())))

    resumed = load_checkpoint(path, model, optimizer, scheduler)
    assert (resumed.step, resumed.data_position) == (2, {"epoch": 0, "index": 16})
    assert resumed.config_yaml == CONFIG_YAML and resumed.path == path
    assert_same_weights(saved_weights, model)
    assert [id(p) for p in model.parameters()] == params_before  # restored in place
    state = optimizer.state_dict()["state"]
    assert state.keys() == saved_adam.keys()
    for index, moments in saved_adam.items():
        for key, value in moments.items():
            assert torch.equal(state[index][key], value), (index, key)
    assert scheduler.get_last_lr() == saved_lr and scheduler.last_epoch == 2
    again = rng_draws()
    assert again[:2] == draws[:2] and torch.equal(again[2], draws[2])


@pytest.mark.usefixtures("fixed_cpu_threads")
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_three_steps_save_load_one_step_equals_four_uninterrupted_steps(tmp_path, device):
    reference, _, _, reference_losses = trained(4, device)

    model, optimizer, scheduler, _ = trained(3, device)
    save_checkpoint(tmp_path, 3, model, optimizer, scheduler, {"index": 3}, CONFIG_YAML)
    del model, optimizer, scheduler

    seed_all(12345)  # a fresh process: other RNG states, other LoRA initialisation
    fresh = tiny_lora_model(lora_seed=99, device=device)
    fresh_optimizer, fresh_scheduler = optimizer_and_scheduler(fresh)
    resumed = load_checkpoint(find_latest(tmp_path), fresh, fresh_optimizer, fresh_scheduler)
    assert resumed.step == 3
    loss = train_step(fresh, fresh_optimizer, fresh_scheduler)

    exact = device == "cpu"
    torch.testing.assert_close(
        loss, reference_losses[3], rtol=0 if exact else 1e-5, atol=0 if exact else 1e-6
    )
    assert_same_weights(lora_state(reference), fresh, exact)


def test_adapter_loads_with_plain_peft(tmp_path):
    model, optimizer, scheduler, _ = trained(2)
    path = save_checkpoint(tmp_path, 2, model, optimizer, scheduler)
    plain = PeftModel.from_pretrained(tiny_llama(VOCAB), path / "adapter")
    plain.eval()
    model.eval()
    input_ids = torch.arange(10).view(1, 10)
    torch.testing.assert_close(plain(input_ids).logits, model(input_ids).logits, rtol=0, atol=0)
    trained_weights = lora_state(model)
    loaded = {name: p for name, p in plain.named_parameters() if "lora_" in name}
    assert loaded.keys() == trained_weights.keys()
    assert all(torch.equal(loaded[name], trained_weights[name]) for name in loaded)


KILLED_SAVE = """
import io, os, sys, time
import torch
from tests.helpers.lora_training import (
    LORA, lora_state, optimizer_and_scheduler, seed_all, tiny_lora_model, train_step
)
from rl.job.checkpoint import save_checkpoint

run_dir = sys.argv[1]
seed_all(0)
model = tiny_lora_model()
optimizer, scheduler = optimizer_and_scheduler(model)
train_step(model, optimizer, scheduler)
save_checkpoint(run_dir, 1, model, optimizer, scheduler, {"index": 1})
torch.save(lora_state(model), os.path.join(run_dir, "step1_weights.pt"))
train_step(model, optimizer, scheduler)
real_save = torch.save

def stalled_save(obj, path):
    buffer = io.BytesIO()
    real_save(obj, buffer)
    with open(path, "wb") as file:
        file.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        file.flush()
        os.fsync(file.fileno())
    print("HALF_WRITTEN", flush=True)
    time.sleep(600)

torch.save = stalled_save
save_checkpoint(run_dir, 2, model, optimizer, scheduler, {"index": 2})
"""


@pytest.mark.timeout(180)
def test_kill_9_in_the_middle_of_a_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_SAVE, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        assert child.stdout.readline().strip() == "HALF_WRITTEN"
    finally:
        child.kill()  # SIGKILL
        child.wait()
    (partial,) = (tmp_path / "checkpoints").glob(".tmp-step_2.*")
    assert partial.name.endswith(f".{child.pid}")
    assert (partial / "trainer_state.pt").is_file() and not (tmp_path / "checkpoints" / "step_2").exists()

    latest = find_latest(tmp_path)
    assert latest == tmp_path / "checkpoints" / "step_1"
    assert not partial.exists()  # the dead process's leftover is cleaned
    fresh = tiny_lora_model(lora_seed=99)
    optimizer, scheduler = optimizer_and_scheduler(fresh)
    assert load_checkpoint(latest, fresh, optimizer, scheduler).data_position == {"index": 1}
    assert_same_weights(torch.load(tmp_path / "step1_weights.pt"), fresh)
    assert save_checkpoint(tmp_path, 2, fresh, optimizer, scheduler) == find_latest(tmp_path)


@pytest.mark.parametrize("crash_at", ["rename", "replace"])
def test_crash_before_rename_or_pointer_update_keeps_a_loadable_checkpoint(tmp_path, monkeypatch, crash_at):
    model, optimizer, scheduler, _ = trained(1)
    save_checkpoint(tmp_path, 1, model, optimizer, scheduler, {"index": 1})
    step1_weights = lora_state(model)
    train_step(model, optimizer, scheduler)

    monkeypatch.setattr(checkpoint.os, crash_at, crash)
    with pytest.raises(OSError, match="disk vanished"):
        save_checkpoint(tmp_path, 2, model, optimizer, scheduler, {"index": 2})
    monkeypatch.undo()

    latest = find_latest(tmp_path)
    assert latest.name == "step_1"  # the pointer still names step 1 in both cases
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")] == []
    fresh = tiny_lora_model(lora_seed=99)
    assert load_checkpoint(latest, fresh, restore_rng=False).data_position == {"index": 1}
    assert_same_weights(step1_weights, fresh)


def test_keep_last_and_resaving_a_step(tmp_path):
    model, optimizer, scheduler, _ = trained(1)
    for step in range(1, 5):
        save_checkpoint(tmp_path, step, model, optimizer, scheduler, {"index": step}, keep_last=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["latest", "step_3", "step_4"]
    save_checkpoint(tmp_path, 3, model, optimizer, scheduler, {"index": 33})
    assert find_latest(tmp_path).name == "step_3"
    assert load_checkpoint(find_latest(tmp_path), model, restore_rng=False).data_position == {"index": 33}
    (tmp_path / "checkpoints" / "latest").write_text("step_9")  # a pointer to a missing checkpoint
    assert find_latest(tmp_path).name == "step_4"


def test_bad_input_gets_a_clear_error_and_leaves_state_intact(tmp_path):
    assert find_latest(tmp_path) is None
    model, optimizer, scheduler, _ = trained(1)
    with pytest.raises(ValueError, match="data position"):
        save_checkpoint(tmp_path, 1, model, optimizer, scheduler, {"sampler": object()})
    assert find_latest(tmp_path) is None and not (tmp_path / "checkpoints").exists()

    path = save_checkpoint(tmp_path, 1, model, optimizer, scheduler)
    with pytest.raises(ValueError, match="run directory"):
        load_checkpoint(tmp_path, model)
    with pytest.raises(
        FileNotFoundError, match="nowhere does not exist: pass a checkpoints/step_<N> directory"
    ):
        load_checkpoint(tmp_path / "nowhere", model)

    torch.manual_seed(5)
    other = get_peft_model(tiny_llama(VOCAB), LoraConfig(r=8, target_modules=["q_proj"]))
    before = lora_state(other)
    with pytest.raises(ValueError, match="r: saved 4 vs model 8"):
        load_checkpoint(path, other, restore_rng=False)
    assert_same_weights(before, other)

    deeper = get_peft_model(tiny_llama(VOCAB, num_hidden_layers=3), LoraConfig(**LORA))
    deeper_optimizer, deeper_scheduler = optimizer_and_scheduler(deeper)
    before = lora_state(deeper)
    with pytest.raises(ValueError, match="does not match the model's LoRA layers.*layers.2"):
        load_checkpoint(path, deeper, deeper_optimizer, deeper_scheduler)
    assert_same_weights(before, deeper)
    assert deeper_optimizer.state_dict()["state"] == {}


def test_partial_saves_of_live_processes_or_other_hosts_are_left_alone(tmp_path, monkeypatch):
    model, optimizer, scheduler, _ = trained(1)
    save_checkpoint(tmp_path, 1, model, optimizer, scheduler)
    monkeypatch.setattr(checkpoint.os, "rename", crash)
    with pytest.raises(OSError, match="disk vanished"):
        save_checkpoint(tmp_path, 2, model, optimizer, scheduler)
    monkeypatch.undo()
    (own,) = (tmp_path / "checkpoints").glob(".tmp-step_2.*")
    host = own.name.split(".")[-2]
    live = own.rename(own.with_name(f".tmp-step_2.{host}.{os.getppid()}"))  # another process saving now
    remote = tmp_path / "checkpoints" / ".tmp-step_3.otherhost.1"  # a save on another machine
    remote.mkdir()
    assert find_latest(tmp_path).name == "step_1"
    assert live.is_dir() and remote.is_dir()
    live.rename(own)  # the same leftover from this (synchronous, so finished) process is cleaned
    assert find_latest(tmp_path).name == "step_1" and not own.exists() and remote.is_dir()


@contextlib.contextmanager
def immutable(path: Path):
    """A directory nobody, root included, can write into (chattr +i), or a skip where that is unsupported."""
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here")
    try:
        yield path
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_run_dir_that_cannot_be_written_is_refused_before_any_work(tmp_path):
    check_run_dir(tmp_path / "new" / "run")  # made when missing
    assert (tmp_path / "new" / "run").is_dir() and list((tmp_path / "new" / "run").iterdir()) == []
    (tmp_path / "a_file").write_text("")
    with pytest.raises(RunDirError, match=r"run_dir=.*a_file cannot be written \(FileExistsError"):
        check_run_dir(tmp_path / "a_file")
    (tmp_path / "run" / "checkpoints").parent.mkdir()
    (tmp_path / "run" / "checkpoints").write_text("")
    with pytest.raises(RunDirError, match=r"checkpoints is a file, but checkpoints are saved in a directory"):
        check_run_dir(tmp_path / "run")
    locked = tmp_path / "locked"
    locked.mkdir()
    with immutable(locked), pytest.raises(RunDirError, match=r"locked cannot be written \(PermissionError"):
        check_run_dir(locked)


def test_a_new_run_is_refused_a_run_dir_with_an_earlier_runs_checkpoints(tmp_path):
    model, optimizer, scheduler, _ = trained(1)
    (tmp_path / "checkpoints" / "step_1").mkdir(parents=True)  # an unfinished save counts for nothing
    check_run_dir(tmp_path)
    save_checkpoint(tmp_path, 2, model, optimizer, scheduler, {"index": 2})
    saved = sorted(path.name for path in (tmp_path / "checkpoints" / "step_2").iterdir())
    with pytest.raises(
        RunDirError, match=r"holds an earlier run's checkpoints \(the last: step_2\).*resume=true"
    ):
        check_run_dir(tmp_path)
    check_run_dir(tmp_path, resume=True)
    assert sorted(path.name for path in (tmp_path / "checkpoints" / "step_2").iterdir()) == saved


def test_a_new_run_is_refused_a_run_dir_with_an_earlier_runs_logs_and_no_checkpoint(tmp_path):
    # a run killed before its first checkpoint (or run with checkpoint_every=0) leaves only its logs
    (tmp_path / "samples.jsonl").write_text("")  # empty logs hold no steps to mix with
    check_run_dir(tmp_path)
    logged = '{"step": 1, "time": 0.0, "reward": 0.5}\n'
    (tmp_path / "metrics.jsonl").write_text(logged)
    with pytest.raises(RunDirError, match=r"holds an earlier run's logs \(metrics.jsonl\) and no checkpoint"):
        check_run_dir(tmp_path)
    check_run_dir(tmp_path, resume=True)  # resume=true goes on in them, from step 0 without a checkpoint
    assert (tmp_path / "metrics.jsonl").read_text() == logged


def test_a_save_that_cannot_write_is_one_message_and_keeps_the_earlier_checkpoints(tmp_path, monkeypatch):
    model, optimizer, scheduler, _ = trained(1)
    save_checkpoint(tmp_path, 1, model, optimizer, scheduler, {"index": 1})

    def disk_full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    monkeypatch.setattr(checkpoint.torch, "save", disk_full)
    with pytest.raises(RunDirError) as err:
        save_checkpoint(tmp_path, 2, model, optimizer, scheduler, {"index": 2})
    monkeypatch.undo()
    message = str(err.value)
    assert message.startswith(f"could not save the checkpoint of step 2 in {tmp_path / 'checkpoints'}: ")
    assert "torch.save could not write" in message and "inline_container.cc" in message
    assert "saved before it are intact" in message and "resume=true" in message
    assert find_latest(tmp_path).name == "step_1"

    blocked = tmp_path / "blocked"
    (blocked / "checkpoints").parent.mkdir()
    (blocked / "checkpoints").write_text("")  # a file where the checkpoint directory goes
    with pytest.raises(RunDirError, match="could not save the checkpoint of step 1 .*FileExistsError"):
        save_checkpoint(blocked, 1, model, optimizer, scheduler)
    with immutable(tmp_path / "checkpoints"), pytest.raises(RunDirError, match="PermissionError"):
        save_checkpoint(tmp_path, 3, model, optimizer, scheduler)
    assert find_latest(tmp_path).name == "step_1"
