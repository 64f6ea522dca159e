"""Decode attention on CPU that reads a shared prompt once per group of sequences (cascade attention).

The samples of a GRPO group share their prompt's KV blocks, so their block tables begin with the same block
ids. The reference decode attention copies every sequence's whole context out of the paged cache in every
layer, and on CPU that copy is most of the attention's time. Here each group's shared prefix is copied once
and attended by all of the group's queries together, each sequence's own suffix is attended separately, and
the two partial softmaxes are merged through their log-sum-exps. The plan depends only on the block tables and
context lengths, so it is built once per step and reused by every layer.
"""

from typing import NamedTuple

import torch

from kernels.paged_attention import DecodeGather, decode_gather, gather_kv

# PyTorch's CPU flash attention, the SDPA kernel that also returns the log-sum-exp of each query row.
_flash_attention_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


class SharedPrefixes(NamedTuple):
    """Groups of decode sequences whose block tables start with the same full blocks."""

    gather: DecodeGather  # each group's shared prefix, one row per group
    query_rows: torch.Tensor  # [num_groups * max_members] batch row of each member (padding repeats one)
    members: torch.Tensor  # [num_members] batch rows of the sequences in some group
    member_slots: torch.Tensor  # [num_members] position of each of them in query_rows
    max_members: int


class CascadePlan(NamedTuple):
    """One step's decode attention: the shared prefixes (None when no sequences share one) and, for each
    group of batch rows bounds[i]:bounds[i + 1], the gather of the rows' own suffixes."""

    prefixes: SharedPrefixes | None
    suffixes: list[DecodeGather]
    bounds: list[int]


def _shared_prefix_groups(
    tables: list[list[int]], lens: list[int], block_size: int
) -> list[tuple[list[int], int]]:
    """(member rows, number of shared blocks) of each group of two or more sequences whose tables agree on
    their first blocks. Only blocks wholly before a sequence's last token count, so every member keeps a
    suffix of at least one token."""
    by_first_block: dict[int, list[int]] = {}
    for row, (table, length) in enumerate(zip(tables, lens, strict=True)):
        if length > block_size:
            by_first_block.setdefault(table[0], []).append(row)
    groups = []
    for members in by_first_block.values():
        if len(members) < 2:
            continue
        limit = min((lens[row] - 1) // block_size for row in members)
        first = tables[members[0]]
        num_blocks = 1
        while num_blocks < limit and all(tables[row][num_blocks] == first[num_blocks] for row in members):
            num_blocks += 1
        groups.append((members, num_blocks))
    return groups


def cascade_plan(
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    bounds: list[int],
    block_size: int,
    num_kv_heads: int,
) -> CascadePlan:
    """Plan the decode attention of sequences with `block_tables` [num_seqs, max_num_blocks] and
    `context_lens` [num_seqs], attended in the row groups that `bounds` delimits."""
    lens = context_lens.tolist()
    groups = _shared_prefix_groups(block_tables.tolist(), lens, block_size)
    starts = [0] * len(lens)
    prefixes = None
    if groups:
        max_members = max(len(members) for members, _ in groups)
        query_rows, members, member_slots = [], [], []
        for index, (rows, num_blocks) in enumerate(groups):
            for position, row in enumerate(rows):
                starts[row] = num_blocks * block_size
                members.append(row)
                member_slots.append(index * max_members + position)
            query_rows.extend(rows + [rows[0]] * (max_members - len(rows)))
        device = block_tables.device
        leaders = torch.tensor([rows[0] for rows, _ in groups], device=device)
        prefix_lens = torch.tensor([num * block_size for _, num in groups], device=device)
        prefixes = SharedPrefixes(
            gather=decode_gather(block_tables[leaders], prefix_lens, block_size, num_kv_heads),
            query_rows=torch.tensor(query_rows, device=device),
            members=torch.tensor(members, device=device),
            member_slots=torch.tensor(member_slots, device=device),
            max_members=max_members,
        )
    first = torch.tensor(starts, device=block_tables.device)
    suffixes = [
        decode_gather(
            block_tables[start:end], context_lens[start:end], block_size, num_kv_heads, first[start:end]
        )
        for start, end in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    return CascadePlan(prefixes, suffixes, bounds)


def _attend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, gather: DecodeGather, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [batch, kv, rows, dim] fp32 over `gather`'s K/V -> (out like q, log-sum-exp [batch, kv, rows])."""
    if gather.max_len == 0:  # no sequence has context: nothing to attend to (the kernel needs a key)
        return torch.zeros_like(q), torch.zeros(q.shape[:-1], device=q.device)
    k, v = gather_kv(k_cache, v_cache, gather)
    out, lse = _flash_attention_cpu(q, k, v, attn_mask=gather.bias, scale=scale)
    if gather.empty is not None:  # a sequence with no context attends to nothing
        out = out.masked_fill(gather.empty[:, None, None, None], 0.0)
    return out, lse


def _attend_prefixes(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, prefixes: SharedPrefixes, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [num_seqs, kv, group, dim] -> (out [num_members, kv * group, dim], lse [num_members, kv * group]) of
    the grouped sequences over their shared prefixes, all members' queries of a KV head in one block."""
    _, num_kv_heads, group, head_dim = q.shape
    num_groups, members = prefixes.gather.bias.shape[0], prefixes.max_members
    packed = q.index_select(0, prefixes.query_rows).view(num_groups, members, num_kv_heads, group, head_dim)
    packed = packed.transpose(1, 2).reshape(num_groups, num_kv_heads, members * group, head_dim)
    out, lse = _attend(packed, k_cache, v_cache, prefixes.gather, scale)
    out = out.view(num_groups, num_kv_heads, members, group, head_dim).transpose(1, 2)
    lse = lse.view(num_groups, num_kv_heads, members, group).transpose(1, 2)
    out = out.reshape(num_groups * members, num_kv_heads * group, head_dim)
    lse = lse.reshape(num_groups * members, num_kv_heads * group)
    return out.index_select(0, prefixes.member_slots), lse.index_select(0, prefixes.member_slots)


def paged_attention_decode_cascade(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: CascadePlan, scale: float
) -> torch.Tensor:
    """Decode attention (as `paged_attention_decode`) of q [num_seqs, num_heads, head_dim] on CPU tensors,
    through a `cascade_plan` of the step."""
    num_seqs, num_heads, head_dim = q.shape
    q_grouped = q.float().view(num_seqs, k_cache.shape[2], -1, head_dim)
    outs, lses = [], []
    for start, end, gather in zip(plan.bounds[:-1], plan.bounds[1:], plan.suffixes, strict=True):
        out, lse = _attend(q_grouped[start:end], k_cache, v_cache, gather, scale)
        outs.append(out.reshape(end - start, num_heads, head_dim))
        lses.append(lse.reshape(end - start, num_heads))
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    if plan.prefixes is not None:
        members = plan.prefixes.members
        prefix_out, prefix_lse = _attend_prefixes(q_grouped, k_cache, v_cache, plan.prefixes, scale)
        suffix_lse = (lses[0] if len(lses) == 1 else torch.cat(lses)).index_select(0, members)
        lse = torch.logaddexp(prefix_lse, suffix_lse)
        merged = prefix_out * (prefix_lse - lse).exp_()[:, :, None]
        merged += out.index_select(0, members) * (suffix_lse - lse).exp_()[:, :, None]
        out = out.index_copy(0, members, merged)
    return out.to(q.dtype)
