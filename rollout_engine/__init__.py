"""The paged rollout engine: PagedAttention KV blocks, copy-on-write GRPO groups, continuous batching."""

from rollout_engine.engine import LLMEngine
from rollout_engine.outputs import Completion, GroupResult, StepOutput, TokenOutput
from rollout_engine.sampling_params import SamplingParams

__all__ = ["Completion", "GroupResult", "LLMEngine", "SamplingParams", "StepOutput", "TokenOutput"]
