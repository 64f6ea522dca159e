"""Sizing the KV pool from the memory fraction.

The engine's own memory (KV pool, the activations of one max-size step, on CUDA the decode graphs, and on
the CPU its one packed copy of each fp32 or bf16 projection and the LM head, pagedrl_kernels/cpu_gemm.py)
stays under memory_fraction x (total device memory on CUDA; memory_budget_bytes, or system RAM, on CPU). The
model weights are shared with the trainer and are not counted. On CUDA the activations are measured with a
dummy step (profiling.py) and the graphs by a trial capture (cuda_graphs.py) before the pool is sized; on CPU
`activation_bytes` estimates the activations, and the packs are the weights' size again (what
engine.stats()['packed_weight_bytes'] reports once they are made).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from pagedrl_kernels.cpu_gemm import pack_bytes
from rollout_engine.block_manager import ceil_div
from rollout_engine.cuda_graphs import measure_graph_bytes
from rollout_engine.models import PagedDecoder
from rollout_engine.profiling import profile_activation_bytes


def kv_bytes_per_block(
    num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """Bytes of K and V for one block across all layers."""
    return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8


def total_memory_bytes(device: torch.device, memory_budget_bytes: int | None) -> int:
    """The memory the fraction applies to: the CUDA device's, the given budget, or system RAM."""
    if memory_budget_bytes is not None:
        return memory_budget_bytes
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_source(device: torch.device, memory_budget_bytes: int | None) -> str:
    """What total_memory_bytes measured, in words for the start-up report."""
    if memory_budget_bytes is not None:
        return "memory_budget_bytes"
    return f"{device} memory" if device.type == "cuda" else "system RAM"


def _format_bytes(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.2f} GiB" if num_bytes >= 2**30 else f"{num_bytes / 2**20:.1f} MiB"


def activation_bytes(
    max_num_batched_tokens: int,
    max_num_seqs: int,
    hidden_size: int,
    intermediate_size: int,
    vocab_size: int,
    dtype: torch.dtype,
) -> int:
    """Peak activations of one max-size step: a few hidden-sized buffers plus the MLP, per token, and
    the fp32 logits with the sampler's softmax/cumsum copies, per sampled row."""
    itemsize = torch.finfo(dtype).bits // 8
    per_token = (8 * hidden_size + 3 * intermediate_size) * itemsize
    per_row = 6 * vocab_size * 4
    return max_num_batched_tokens * per_token + max_num_seqs * per_row


def num_kv_blocks(
    budget_bytes: int,
    activation_bytes: int,
    bytes_per_block: int,
    max_model_len: int,
    block_size: int,
    graph_bytes: int = 0,
    packed_bytes: int = 0,
) -> int:
    """How many KV blocks fit in the budget after the activations, the CUDA graphs and the packed weights;
    ValueError when not even one max_model_len sequence fits."""
    reserved = activation_bytes + graph_bytes + packed_bytes
    num_blocks = max(budget_bytes - reserved, 0) // bytes_per_block
    num_needed = ceil_div(max_model_len, block_size)
    if num_blocks < num_needed:
        need = num_needed * bytes_per_block + reserved
        raise ValueError(
            f"the KV budget of {budget_bytes / 2**20:.1f} MiB holds {num_blocks} blocks after "
            f"{activation_bytes / 2**20:.1f} MiB of activations, {graph_bytes / 2**20:.1f} MiB of CUDA "
            f"graphs and {packed_bytes / 2**20:.1f} MiB of packed weights, but one sequence of max_model_len="
            f"{max_model_len} tokens needs {num_needed} blocks ({need / 2**20:.1f} MiB in all); raise "
            "memory_fraction or memory_budget_bytes, or lower max_model_len / max_num_batched_tokens (and, "
            "for the CUDA graphs, max_num_seqs, or pass enforce_eager=True)"
        )
    return num_blocks


@dataclass(frozen=True, slots=True)
class KvPoolPlan:
    """The KV pool sized for an engine: its blocks, the bytes its budget reserved for CUDA graphs and for
    packed weights, and the budget it came from (memory_fraction x total_bytes of `source`)."""

    num_blocks: int
    block_size: int
    graph_bytes: int
    packed_bytes: int
    memory_fraction: float
    total_bytes: int
    source: str

    def report(self, kv_bytes: int, commits_on_write: bool) -> str:
        """The line the engine logs at start-up: the KV pool of `kv_bytes` it reserved, whether that memory is
        taken now or as blocks are written, and the budget that sized it."""
        graphs = f" and {_format_bytes(self.graph_bytes)} for CUDA graphs" if self.graph_bytes else ""
        packs = f" and {_format_bytes(self.packed_bytes)} of packed weights" if self.packed_bytes else ""
        taken = (
            "taken page by page as blocks are written (engine.stats()['kv_bytes_resident'] is what is held)"
            if commits_on_write
            else "allocated now"
        )
        budget = _format_bytes(int(self.memory_fraction * self.total_bytes))
        return (
            f"KV pool: reserved {self.num_blocks} blocks x {self.block_size} tokens = {kv_bytes} bytes "
            f"({_format_bytes(kv_bytes)}), {taken}{graphs}, from memory_fraction={self.memory_fraction} x "
            f"{_format_bytes(self.total_bytes)} of {self.source} = {budget}, less one step's "
            f"activations{packs}; pass a smaller memory_fraction or memory_budget_bytes to reserve less"
        )


def plan_kv_pool(
    model: PagedDecoder,
    config: PretrainedConfig,
    block_size: int,
    memory_fraction: float,
    memory_budget_bytes: int | None,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    use_graphs: bool,
) -> KvPoolPlan:
    """The KV pool of the paged `model` under memory_fraction of total_memory_bytes: activations measured on
    CUDA and estimated on CPU, graphs measured by a trial capture when used, packs the size of the weights
    they copy."""
    weight = model.embed_tokens.weight
    device, dtype = weight.device, weight.dtype
    total_bytes = total_memory_bytes(device, memory_budget_bytes)
    if device.type == "cuda":
        act = profile_activation_bytes(
            model, block_size, dtype, device, max_num_batched_tokens, max_num_seqs, max_model_len
        )
    else:
        sizes = (config.hidden_size, config.intermediate_size, weight.shape[0])
        act = activation_bytes(max_num_batched_tokens, max_num_seqs, *sizes, dtype)
    per_block = kv_bytes_per_block(model.num_layers, block_size, model.num_kv_heads, model.head_dim, dtype)
    max_blocks_per_seq = ceil_div(max_model_len, block_size)
    graph_bytes = 0
    if use_graphs:
        graph_bytes = measure_graph_bytes(model, block_size, max_num_seqs, max_blocks_per_seq)
    products = [linear.weight for layer in model.layers for stack in layer.products for linear in stack]
    packed = pack_bytes([*products, model.lm_head.weight])
    budget_bytes = int(memory_fraction * total_bytes)
    num_blocks = num_kv_blocks(budget_bytes, act, per_block, max_model_len, block_size, graph_bytes, packed)
    source = memory_source(device, memory_budget_bytes)
    return KvPoolPlan(num_blocks, block_size, graph_bytes, packed, memory_fraction, total_bytes, source)
