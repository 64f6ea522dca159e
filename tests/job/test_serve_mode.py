"""`python train.py mode=serve checkpoint=...` serves the checkpoint's adapter (greedy replies are peft's
greedy continuations, not the base model's) on the port it names, and stops cleanly on Ctrl-C; without a
checkpoint the engine holds no LoRA and replies as transformers' base model does, and a checkpoint exported
(mode=export) and served as model=hf replies as its adapter, with no LoRA; what cannot work is refused with
one line before the model loads."""

import signal
import socket
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import torch

from rl.config.schema import register_configs
from rl.job import distributed as dp
from rl.job import modes
from rl.job.model_loading import load_model
from rl.settings import ConfigError
from rollout_engine import SamplingParams
from tests.helpers.ctrl_c import popen_interruptible
from tests.helpers.live_server import LiveServer, hf_greedy, hf_log_softmax
from tests.helpers.train_runs import adapted_checkpoint, compose_cfg, peft_reference

REPO = Path(__file__).resolve().parents[2]

PROMPT = [1, 520, 9531, 198, 4093, 17, 88]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return adapted_checkpoint(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module")
def serve_command():
    register_configs()
    return modes


def serve_cfg(tmp_path, *overrides):
    return compose_cfg(tmp_path / "run", "mode=serve", *overrides)


@pytest.mark.timeout(300)
def test_the_command_serves_the_checkpoints_adapter_and_stops_on_ctrl_c(checkpoint, tmp_path):
    command = [
        sys.executable,
        "train.py",
        "mode=serve",
        "model=tiny_llama",
        "model.dtype=float32",  # as the fp32 reference below, on any CPU
        f"checkpoint={checkpoint}",
        "serve.port=0",
        "serve.model_name=policy",
        "rollout.memory_budget_bytes=2000000000",
        "rollout.max_model_len=256",
        f"hydra.run.dir={tmp_path}",
    ]
    child = popen_interruptible(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        lines = []
        while not (lines and lines[-1].startswith("serving ")):
            line = child.stdout.readline()
            assert line, "the server exited:\n" + "".join(lines)
            lines.append(line)
        assert f"serving policy ({checkpoint}) at http://127.0.0.1:" in lines[-1]
        base_url = lines[-1].split(" at ")[1].strip()
        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
        assert [card.id for card in client.models.list().data] == ["policy"]
        reply = client.completions.create(model="policy", prompt=PROMPT, max_tokens=8, temperature=0)
    finally:
        child.send_signal(signal.SIGINT)
        output, _ = child.communicate(timeout=60)
    assert child.returncode == 0 and output.endswith("server stopped\n"), output
    reference = peft_reference(checkpoint)
    _, tokenizer = load_model("tiny_llama", dtype="float32", device="cpu")
    adapted = hf_greedy(reference, PROMPT, 8, tokenizer.eos_token_id)
    with reference.disable_adapter():
        base = hf_greedy(reference, PROMPT, 8, tokenizer.eos_token_id)
    assert adapted != base  # the adapter changes the reply, so the check below can fail
    assert reply.choices[0].text == tokenizer.decode(adapted, skip_special_tokens=True)


def test_without_a_checkpoint_the_base_model_is_served_with_no_lora(serve_command, tmp_path):
    cfg = serve_cfg(tmp_path)
    engine, name = serve_command.serving_engine(cfg), serve_command.serving_name(cfg)
    tokenizer = engine.tokenizer
    assert engine.lora is None and engine.lora_buffers() == {}  # no LoRA term in any projection
    server = LiveServer(engine, tokenizer, name)
    try:
        reply = server.client().completions.create(
            model=name, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=1
        )
    finally:
        server.close()
    base, _ = load_model("tiny_llama", dtype="float32", device="cpu")
    expected = hf_greedy(base, PROMPT, 8, tokenizer.eos_token_id)
    assert reply.choices[0].text == tokenizer.decode(expected, skip_special_tokens=True)
    distribution = hf_log_softmax(base, PROMPT, expected, 0.0)  # the whole distribution, not the argmax
    logprobs = distribution.gather(1, torch.tensor(expected)[:, None]).squeeze(1)
    torch.testing.assert_close(
        torch.tensor(reply.choices[0].logprobs.token_logprobs), logprobs, atol=1e-4, rtol=0
    )


def test_an_export_is_served_without_lora_and_replies_as_the_adapter_does(
    serve_command, checkpoint, tmp_path
):
    out = tmp_path / "merged"
    serve_command.export_only(
        compose_cfg(tmp_path / "run", "mode=export", f"checkpoint={checkpoint}", f"export.dir={out}")
    )
    engine = serve_command.serving_engine(serve_cfg(tmp_path, "model=hf", f"model.path={out}"))
    tokenizer = engine.tokenizer
    assert engine.lora is None
    (group,) = engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=8))
    reference = peft_reference(checkpoint)
    adapted = hf_greedy(reference, PROMPT, 8, tokenizer.eos_token_id)
    with reference.disable_adapter():
        assert hf_greedy(reference, PROMPT, 8, tokenizer.eos_token_id) != adapted  # so the check can fail
    assert group.samples[0].token_ids == adapted


def test_serve_with_the_engine_in_another_process_is_refused(serve_command, tmp_path):
    cfg = serve_cfg(tmp_path, "rollout.placement=process")
    with pytest.raises(ConfigError, match="rollout.placement=process: mode=serve steps the engine"):
        serve_command.check_serving(cfg, dp.SINGLE_PROCESS)


def test_a_missing_checkpoint_is_refused_before_the_model_loads(serve_command, tmp_path):
    cfg = serve_cfg(tmp_path, f"checkpoint={tmp_path / 'nowhere'}")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        serve_command.check_serving(cfg, dp.SINGLE_PROCESS)


def test_a_port_in_use_is_refused_before_the_model_loads(serve_command, tmp_path, monkeypatch):
    monkeypatch.setattr(serve_command, "serving_engine", lambda *args: pytest.fail("the model loaded"))
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        cfg = serve_cfg(tmp_path, f"serve.port={port}")
        with pytest.raises(ConfigError, match=f"cannot listen on serve.host=127.0.0.1 serve.port={port}"):
            serve_command.serve_only(cfg)


def test_the_other_modes_do_not_need_the_server_stack():
    """train.py imports fastapi and uvicorn for mode=serve alone: a training machine without them (or with a
    fastapi whose own imports fail) still trains."""
    probe = "import sys, train; print([m for m in ('fastapi', 'uvicorn', 'serve.app') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
