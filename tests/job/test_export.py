"""mode=export: a checkpoint's LoRA merged into its base model loads with plain transformers and gives the
logits of peft's base + adapter, whatever model.dtype the export loads with (the merge runs in fp32 and the
default export.dtype saves fp32); its weights are W + scale * B A; an explicit bf16 export holds that sum
rounded once and warns how far the rounding moves the logits; the tokenizer and chat template come along;
what cannot work is refused with one line, before the model loads where no model is needed."""

import json

import pytest
import torch
from hydra.errors import ConfigCompositionException
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaForCausalLM

import train
from rl.job import export
from rl.job.checkpoint import ADAPTER, ADAPTER_WEIGHTS, save_checkpoint
from rl.job.model_loading import load_model
from rl.job.modes import export_only
from rl.settings import ConfigError
from rl.sync.adapter import add_lora
from tests.helpers.train_runs import adapted_checkpoint, compose_cfg, peft_reference

SEQUENCES = [[1, 520, 9531, 198, 4093, 17, 88], [2, 33], list(range(100, 140))]
PROJECTION = "model.layers.1.mlp.down_proj"  # a projection the default LoRA (all seven) adapts
MESSAGES = [{"role": "system", "content": "Answer in SQL."}, {"role": "user", "content": "How many pets?"}]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return adapted_checkpoint(tmp_path_factory.mktemp("run"))


def export_cfg(tmp_path, *overrides):
    return compose_cfg(tmp_path / "run", "mode=export", *overrides)


@pytest.fixture(scope="module")
def exported(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "merged"
    export_only(export_cfg(out.parent, f"checkpoint={checkpoint}", f"export.dir={out}"))
    return out


@pytest.fixture(scope="module")
def exported_from_bf16(checkpoint, tmp_path_factory):
    """The default export with the model loaded in bf16, as model.dtype=auto loads it on a CPU with native
    bf16 (and on CUDA)."""
    out = tmp_path_factory.mktemp("export_bf16") / "merged"
    export_only(
        export_cfg(out.parent, f"checkpoint={checkpoint}", f"export.dir={out}", "model.dtype=bfloat16")
    )
    return out


def max_logit_diff(model, reference, sequences=SEQUENCES) -> float:
    with torch.no_grad():
        return max(
            (model(torch.tensor([s])).logits.float() - reference(torch.tensor([s])).logits).abs().max().item()
            for s in sequences
        )


@pytest.mark.parametrize("export_of", ["exported", "exported_from_bf16"])
def test_the_export_loads_without_peft_and_gives_the_adapted_models_logits(export_of, checkpoint, request):
    merged = AutoModelForCausalLM.from_pretrained(request.getfixturevalue(export_of))
    assert type(merged) is LlamaForCausalLM and merged.dtype == torch.float32
    reference = peft_reference(checkpoint)
    for sequence in SEQUENCES:
        ids = torch.tensor([sequence])
        with torch.no_grad():
            expected, got = reference(ids).logits, merged(ids).logits
            with reference.disable_adapter():
                base = reference(ids).logits
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
        assert (expected - base).abs().max() > 1e-2  # the adapter matters, so the check above can fail


def test_the_merged_weight_is_w_plus_scale_b_a(exported, checkpoint):
    weights = load_file(exported / "model.safetensors")
    adapter = load_file(checkpoint / ADAPTER / ADAPTER_WEIGHTS)
    base, _ = load_model("tiny_llama", dtype="float32", device="cpu")
    w = dict(base.named_parameters())[f"{PROJECTION}.weight"].detach()
    a = adapter[f"base_model.model.{PROJECTION}.lora_A.weight"]  # [r, in_features]
    b = adapter[f"base_model.model.{PROJECTION}.lora_B.weight"]  # [out_features, r]
    scale = 32 / 16  # alpha / r
    torch.testing.assert_close(weights[f"{PROJECTION}.weight"], w + scale * b @ a, atol=1e-6, rtol=0)
    assert not [name for name in weights if "lora" in name]


def test_the_export_is_a_plain_model_directory_with_the_tokenizer_and_its_chat_template(exported):
    names = {path.name for path in exported.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= names
    assert "adapter_config.json" not in names
    config = (exported / "config.json").read_text()
    assert "pagedrl" not in config and json.loads(config)["dtype"] == "float32"  # no in-process attention
    _, original = load_model("tiny_llama", dtype="float32", device="cpu")
    tokenizer = AutoTokenizer.from_pretrained(exported)
    assert tokenizer.chat_template == original.chat_template
    prompt = dict(add_generation_prompt=True, tokenize=True, return_dict=False)
    assert tokenizer.apply_chat_template(MESSAGES, **prompt) == original.apply_chat_template(
        MESSAGES, **prompt
    )
    assert GenerationConfig.from_pretrained(exported).eos_token_id == original.eos_token_id
    assert [p.name for p in exported.parent.iterdir()] == [exported.name]  # no temporary directory left


@pytest.mark.parametrize(
    "overrides", [["export.dtype=bfloat16"], ["export.dtype=model", "model.dtype=bfloat16"]]
)
def test_a_bf16_export_holds_the_fp32_sum_rounded_once_and_warns_how_far_it_moves_the_logits(
    overrides, checkpoint, tmp_path, capsys
):
    out = tmp_path / "bf16"
    setting = overrides[0]
    with pytest.warns(RuntimeWarning, match=f"{setting} rounds the merged weights to bfloat16") as warned:
        export_only(export_cfg(tmp_path, f"checkpoint={checkpoint}", f"export.dir={out}", *overrides))
    assert f"as bfloat16 weights ({setting}), to {out}" in capsys.readouterr().out
    weights = load_file(out / "model.safetensors")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    adapter = load_file(checkpoint / ADAPTER / ADAPTER_WEIGHTS)
    base, tokenizer = load_model("tiny_llama", dtype="float32", device="cpu")
    w = dict(base.named_parameters())[f"{PROJECTION}.weight"].detach()
    delta = (
        2.0
        * adapter[f"base_model.model.{PROJECTION}.lora_B.weight"]
        @ adapter[f"base_model.model.{PROJECTION}.lora_A.weight"]
    )
    assert torch.equal(weights[f"{PROJECTION}.weight"], (w + delta).to(torch.bfloat16))
    # the warning's number is the size of how far the saved model's logits of the probe sit from peft's base
    # + adapter (bf16 arithmetic, whose rounding differs between attention kernels, moves its last digits)
    (message,) = [str(record.message) for record in warned if "rounds the merged" in str(record.message)]
    said = float(message.split("logits move by up to ")[1].split(" ")[0])
    rounded, reference = AutoModelForCausalLM.from_pretrained(out), peft_reference(checkpoint)
    probe = tokenizer(export.PROBE_TEXT).input_ids
    assert 0.5 < said / max_logit_diff(rounded, reference, [probe]) < 2
    assert max_logit_diff(rounded, reference) > 1e-3  # what the default export keeps, a bf16 one loses


def error_line(cfg) -> str:
    with pytest.raises(SystemExit) as stopped:
        train.main(cfg)
    message = str(stopped.value.code)
    assert message.startswith("error: ") and "\n" not in message
    return message


def never_loaded(*args, **kwargs):
    raise AssertionError("the model loaded: the check came too late")


def test_what_needs_no_model_is_refused_before_the_model_loads(checkpoint, tmp_path, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.setattr(export, "load_model", never_loaded)
    out = tmp_path / "out"
    no_checkpoint = error_line(export_cfg(tmp_path, f"export.dir={out}"))
    assert "mode=export needs checkpoint=RUN_DIR/checkpoints/step_<N>" in no_checkpoint
    no_dir = error_line(export_cfg(tmp_path, f"checkpoint={checkpoint}"))
    assert "mode=export needs export.dir=<a new directory>" in no_dir
    missing = error_line(export_cfg(tmp_path, f"checkpoint={tmp_path}/nowhere", f"export.dir={out}"))
    assert f"checkpoint {tmp_path}/nowhere does not exist" in missing
    incomplete = tmp_path / "step_3"
    incomplete.mkdir()
    partial = error_line(export_cfg(tmp_path, f"checkpoint={incomplete}", f"export.dir={out}"))
    assert "is not a complete checkpoint (missing adapter/adapter_model.safetensors" in partial
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    full = error_line(export_cfg(tmp_path, f"checkpoint={checkpoint}", f"export.dir={out}"))
    assert f"export.dir={out} exists and is not empty" in full and "pass export.dir=<a new directory>" in full
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"


def test_a_checkpoint_that_does_not_fit_the_lora_settings_is_refused(checkpoint, tmp_path, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    out = tmp_path / "out"
    cfg = export_cfg(tmp_path, f"checkpoint={checkpoint}", f"export.dir={out}", "lora.rank=8")
    assert "r: saved 16 vs model 8" in error_line(cfg)
    cfg = export_cfg(
        tmp_path, f"checkpoint={checkpoint}", f"export.dir={out}", "lora.target_modules=attention"
    )
    assert "target_modules" in error_line(cfg)
    assert not out.exists()


def test_an_empty_export_dir_is_filled_and_a_failed_write_leaves_nothing(checkpoint, tmp_path, monkeypatch):
    out = tmp_path / "empty"
    out.mkdir()
    export_only(export_cfg(tmp_path, f"checkpoint={checkpoint}", f"export.dir={out}"))
    assert (out / "model.safetensors").is_file()

    def disk_full(directory):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "fsync_tree", disk_full)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    failed = tmp_path / "failed"
    message = error_line(export_cfg(tmp_path, f"checkpoint={checkpoint}", f"export.dir={failed}"))
    assert "could not write the export" in message and "No space left on device" in message
    assert not failed.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_an_adapter_that_makes_a_weight_non_finite_is_refused(tmp_path, monkeypatch):
    model = add_lora(load_model("tiny_llama", dtype="float32", device="cpu")[0])
    with torch.no_grad():
        dict(model.named_parameters())[f"base_model.model.{PROJECTION}.lora_B.default.weight"].fill_(
            float("inf")
        )
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    broken = save_checkpoint(tmp_path / "broken_run", 1, model, optimizer)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    out = tmp_path / "out"
    message = error_line(export_cfg(tmp_path, f"checkpoint={broken}", f"export.dir={out}"))
    assert f"non-finite values in 1 weights (for example {PROJECTION}.weight)" in message
    assert not out.exists()


def test_an_unknown_export_dtype_is_refused_naming_the_key_and_its_choices(checkpoint, tmp_path, monkeypatch):
    with pytest.raises(ConfigCompositionException) as composed:  # on the command line, as model.dtype=int8
        export_cfg(tmp_path, "export.dtype=int8")
    cause = str(composed.value.__cause__)
    assert "expected one of [float32, bfloat16, float16, model]" in cause
    assert "full_key: export.dtype" in cause
    monkeypatch.setattr(export, "load_model", never_loaded)
    model_kwargs = dict(name="tiny_llama", dtype="float32", device="cpu")
    with pytest.raises(ConfigError) as refused:
        export.export_checkpoint(str(checkpoint), str(tmp_path / "out"), model_kwargs, {}, dtype="int8")
    assert str(refused.value) == (
        "unknown export.dtype 'int8'; choose one of ('float32', 'bfloat16', 'float16', 'model')"
    )


def test_a_merged_weight_outside_float16s_range_is_refused(tmp_path, monkeypatch):
    model = add_lora(load_model("tiny_llama", dtype="float32", device="cpu")[0])
    with torch.no_grad():
        dict(model.named_parameters())[f"base_model.model.{PROJECTION}.lora_B.default.weight"].fill_(1e6)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    large = save_checkpoint(tmp_path / "large_run", 1, model, optimizer)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    out = tmp_path / "out"
    message = error_line(
        export_cfg(tmp_path, f"checkpoint={large}", f"export.dir={out}", "export.dtype=float16")
    )
    assert (
        f"export.dtype=float16: 1 merged weights (for example {PROJECTION}.weight) overflow float16"
        in message
    )
    assert "use export.dtype=float32" in message and not out.exists()
