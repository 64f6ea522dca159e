"""Typed schemas for the Hydra config tree in `conf/`: each setting's type, default and choices, once.

Every group's YAML is merged into these dataclasses, so an unknown key or a value of the wrong type is
rejected at composition with a message that names the key; the YAML files hold only what differs from
these defaults. Each group owns the value ranges of its keys (its ``RULES``, an `rl.settings.Settings`), and
`rl.config.checks.check_config` checks them all, once, before any work starts.

Only the job reads the config tree (`train.py` and the `rl.job` modules it runs: parts, grpo_step, stages,
bookkeeping, modes, and `serve.command`); components take flat arguments, or one typed value. A
component's own settings live beside it and are assembled here: `rl.algo.losses.LossConfig` (the algo.*
keys of the update, which `train_step` takes as they are), and `rl.sync.adapter.LoraConfig`,
`rl.report.logger.LoggerConfig` and `rl.tasks.curriculum.CurriculumConfig`, whose fields are the defaults of
`add_lora`, `RunLogger` and `Curriculum`. The choices come from the components' own lists. An installed
env plugin's own config folder (`envs.plugin_config_dirs`) joins Hydra's search path after `conf/`, so
``env=<plugin name>`` finds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import MISSING

from envs import plugin_config_dirs
from rl.algo.advantages import ESTIMATORS, SCALES
from rl.algo.losses import LossConfig
from rl.algo.optim import LR_RULE, SCHEDULES, WARMUP_STEPS_RULE, WEIGHT_DECAY_RULE
from rl.algo.trainer import MAX_GRAD_NORM_RULE, MICRO_BATCH_SIZE_RULE
from rl.job.export import ExportDType
from rl.job.model_loading import DTYPES, MODEL_NAMES
from rl.report.logger import LoggerConfig
from rl.settings import Settings, at_least, choices, fraction, optional, positive
from rl.sync.adapter import LoraConfig
from rl.tasks.curriculum import CurriculumConfig

ModelName = choices("ModelName", MODEL_NAMES)
DType = choices("DType", ("auto", *DTYPES))
Mode = choices("Mode", ("train", "eval", "export", "serve"))
Placement = choices("Placement", ("inprocess", "process"))
Estimator = choices("Estimator", ESTIMATORS)
AdvantageScale = choices("AdvantageScale", SCALES)
Schedule = choices("Schedule", SCHEDULES)


@dataclass
class ModelConfig:
    name: ModelName = MISSING
    path: str | None = None  # model=hf: a local checkpoint directory or Hub id
    dtype: DType = DType.auto  # auto: bf16 on CUDA and on a CPU with native bf16, else fp32
    device: str = "auto"
    seed: int = 0  # initialisation seed of the tiny random models


@dataclass
class RolloutConfig(Settings):
    RULES = (
        ("memory_fraction", fraction, "use a fraction in (0, 1]"),
        ("memory_budget_bytes", optional(at_least(1)), "use a number of bytes >= 1, or null (system RAM)"),
        ("block_size", at_least(1), "use an integer >= 1 (tokens per KV block)"),
        ("max_num_seqs", at_least(1), "use an integer >= 1"),
        ("max_num_batched_tokens", at_least(1), "use an integer >= 1"),
        ("max_model_len", optional(at_least(1)), "use an integer >= 1, or null (the model's own)"),
        ("temperature", positive, "use a finite number > 0 (GRPO samples a group of different answers)"),
        ("top_p", fraction, "use a fraction in (0, 1] (1 disables it)"),
        ("top_k", lambda v: v == -1 or at_least(1)(v), "use -1 (disabled) or an integer >= 1"),
        ("max_tokens", at_least(1), "use an integer >= 1 (tokens per turn)"),
        ("max_completion_tokens", at_least(1), "use an integer >= 1 (tokens per episode)"),
        ("sync_bucket_mb", at_least(1), "use an integer >= 1"),
    )

    placement: Placement = Placement.inprocess  # process: the engine runs in a rollout-worker process
    memory_fraction: float = 0.35
    memory_budget_bytes: int | None = None  # CPU: the budget the fraction applies to (None: system RAM)
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enforce_eager: bool = False  # CUDA: run decode eagerly instead of replaying CUDA graphs
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 128  # per turn
    max_completion_tokens: int = 256  # per episode, observations included
    sync_bucket_mb: int = 64


@dataclass
class AlgoConfig(LossConfig):
    """The algo.* keys: GRPO groups and their advantages here, the policy update's in LossConfig."""

    RULES = (
        ("group_size", at_least(2), "use an integer >= 2 (GRPO compares the samples of a group)"),
        ("oversample", at_least(1), "use a number >= 1 (1: each round plays only the groups it needs)"),
        *LossConfig.RULES,
    )

    group_size: int = 8
    estimator: Estimator = Estimator.grpo
    scale: AdvantageScale = AdvantageScale.group
    dynamic_sampling: bool = False  # DAPO: drop groups whose rewards are all equal
    # with dynamic_sampling, each round plays this many times the groups it still needs in one engine call
    # (the extra groups cost batch rows, not a sequential round), keeping the first whose rewards differ
    oversample: float = 1.0
    guidance: bool = False  # LUFFY: a group that all failed learns a demonstration (rl.job.guidance)


@dataclass
class EnvConfig(Settings):
    RULES = (
        ("eval_tasks", at_least(1), "use an integer >= 1"),
        ("step_timeout_s", positive, "use a finite number of seconds > 0"),
    )

    name: str = MISSING  # built-in name, `pagedrl.envs` entry point, or dotted path
    args: dict[str, Any] = field(default_factory=dict)  # the env's flat constructor arguments
    tasks: dict[str, Any] = field(default_factory=dict)  # `_target_` returning a DatasetDict(train, test)
    eval_tasks: int = 200  # held-out tasks scored greedily
    eval_seed: int = 0  # draws the held-out sample; apart from `seed`, so every training seed meets one set
    eval_labels: list[str] = field(default_factory=lambda: ["family", "difficulty"])  # accuracy by these
    shared_prompt_key: str | None = None  # task field whose rows share a prompt prefix (batched together)
    step_timeout_s: float = 60.0  # a plugin's step() running longer fails its episode (env/timeouts)


@dataclass
class TransferConfig(Settings):
    """A second held-out set (``transfer=spider_heldout``): the test split of another task source, scored like
    the env's own at the base, after the warm start and at the end. No `tasks`: none (``transfer=none``)."""

    RULES = (("eval_tasks", at_least(1), "use an integer >= 1"),)

    tasks: dict[str, Any] = field(default_factory=dict)  # `_target_` returning a DatasetDict(train, test)
    eval_tasks: int = 500  # tasks sampled from its test split
    eval_seed: int = 0  # draws the sample (and splits a source that returns one Dataset)
    labels: list[str] = field(default_factory=lambda: ["family", "db_id"])  # accuracy by these


@dataclass
class TrainerConfig(Settings):
    RULES = (LR_RULE, WEIGHT_DECAY_RULE, WARMUP_STEPS_RULE, MAX_GRAD_NORM_RULE, MICRO_BATCH_SIZE_RULE)

    lr: float = 2e-5
    weight_decay: float = 0.0
    lr_schedule: Schedule = Schedule.constant
    warmup_steps: int = 0
    max_grad_norm: float | None = 1.0  # None (null): no clipping
    micro_batch_size: int = 8


@dataclass
class SftConfig(Settings):
    """The supervised warm start on the env's demonstrations of training tasks, run before GRPO."""

    RULES = (
        ("steps", at_least(0), "use an integer >= 0 (0: no warm start)"),
        ("batch_size", at_least(1), "use an integer >= 1"),
        LR_RULE,
        WARMUP_STEPS_RULE,
        (
            "micro_batch_size",
            optional(at_least(1)),
            "use an integer >= 1, or null for trainer.micro_batch_size",
        ),
        ("anchor_coef", at_least(0), "use a number >= 0 (0: GRPO steps take no demonstrations)"),
        ("eval_every", at_least(0), "use an integer >= 0 (0: score the warm start only at its end)"),
    )

    steps: int = 0  # 0: no warm start
    batch_size: int = 16
    lr: float = 2e-4
    lr_schedule: Schedule = Schedule.constant  # cosine: from lr down to 0 at the last warm-start step
    warmup_steps: int = 0
    # rows per forward and backward; null: trainer.micro_batch_size. Rows of one micro-batch that start with
    # the same prompt run it once (rl.algo.logprobs), so where a batch shares its prompt's schema
    # (env.shared_prompt_key) one micro-batch of the whole batch runs that schema once, not once per part
    micro_batch_size: int | None = None
    # > 0: every GRPO step adds this x the NLL of one batch of these demonstrations (sft.batch_size rows) to
    # its policy loss (PPO-ptx), so GRPO keeps what the warm start taught while the reward moves the policy
    anchor_coef: float = 0.0
    # > 0: the held-out set is also scored every eval_every warm-start steps (points "sft" at those steps in
    # summary.json's eval_history), so a supervised run shows where its score stops rising and which step
    # scored best
    eval_every: int = 0


@dataclass
class EvalConfig(Settings):
    """Sampled scoring beside greedy accuracy: at every evaluation point of a run (the held-out set) and in
    mode=eval (the transfer set too); and whether a run scores the policy it starts from."""

    RULES = (
        ("samples", at_least(0), "use an integer >= 0 (0: greedy accuracy alone; K: pass@k from K samples)"),
    )

    samples: int = 0  # K > 0: pass@k, k = 1, 2, 4 ... K, from K samples a task at the rollout's settings
    # a fresh run first scores the policy it starts from (the base model, or checkpoint='s adapter); false
    # skips that where its score is known (a checkpoint its own run scored), and summary.json leaves it None
    at_start: bool = True


@dataclass
class ExportConfig:
    """mode=export: where the checkpoint's adapter, merged into the base model, is saved, and its dtype."""

    dir: str | None = None  # a new (or empty) directory: a Hugging Face model that loads without peft
    # the saved weights' dtype; the merge itself runs in fp32 whatever model.dtype says. float32 keeps the
    # adapter's update whole; bfloat16, float16 or model (model.dtype's) round it, and a warning says how far
    dtype: ExportDType = ExportDType.float32


@dataclass
class ServeConfig(Settings):
    """mode=serve: the OpenAI-compatible server over the engine (serve/)."""

    RULES = (
        ("port", lambda v: at_least(0)(v) and v <= 65535, "use a port in [0, 65535] (0: any free port)"),
    )

    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (the start-up line names it)
    model_name: str | None = None  # what requests' `model` must say (None: model.path, or the model= choice)


@dataclass
class TrainConfig(Settings):
    RULES = (
        (
            "num_steps",
            at_least(0),
            "use an integer >= 0 (0: the stages before GRPO alone, as an SFT-only control)",
        ),
        ("prompts_per_step", at_least(1), "use an integer >= 1"),
        ("eval_every", at_least(0), "use an integer >= 0 (0: evaluate only before and after training)"),
        ("checkpoint_every", at_least(0), "use an integer >= 0 (0: no checkpoints)"),
        ("keep_checkpoints", at_least(1), "use an integer >= 1"),
    )

    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    transfer: TransferConfig = field(default_factory=TransferConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SftConfig = field(default_factory=SftConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    mode: Mode = Mode.train
    seed: int = 0
    num_steps: int = 40
    prompts_per_step: int = 8  # GRPO groups per step; per rank under torchrun (TRL's per-device batch)
    eval_every: int = 10  # 0: evaluate only before and after training
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    resume: bool = False
    checkpoint: str | None = None  # mode=eval: the one to score (None: the base model); export: to merge;
    # serve: the adapter to serve (None: the base model); train: the adapter a new run starts from (its
    # weights alone: a fresh optimizer and step 0; resume=true with a checkpoint in run_dir takes that one)
    run_dir: str = MISSING


class PluginConfigs(SearchPathPlugin):
    """Puts each installed env plugin's config folder on Hydra's search path, after conf/ (which wins)."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        for directory in plugin_config_dirs():
            search_path.append("pagedrl-env-plugin", f"file://{directory}")


def register_configs() -> None:
    """Register the schemas that conf/*.yaml extend through their defaults lists, and the search path of
    the installed env plugins' own configs."""
    Plugins.instance().register(PluginConfigs)
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    for group, node in [
        ("model", ModelConfig),
        ("algo", AlgoConfig),
        ("env", EnvConfig),
        ("transfer", TransferConfig),
    ]:
        cs.store(group=group, name=f"{group}_schema", node=node)
