"""Micro-batches that follow the rows' shared prompts: the cut worked by hand, the tokens the forward really
runs, and the same gradient as one row at a time."""

import pytest
import torch

from rl.algo.batch import collate_rollouts
from rl.algo.losses import LossConfig
from rl.algo.micro_batches import RUN_COST_TOKENS, adjacent_shared_prefixes, micro_batch_slices
from rl.algo.trainer import accumulate_gradients, batch_logprobs

# Two samples of a question, two of another question on the same 95-token schema (they part at column 95),
# and two of a question on another schema (it parts from the others at column 1). Every prompt is 100 tokens,
# so the packed prefix stops at 99 (the logits at column 99 predict the first completion token).
SCHEMA, OTHER_SCHEMA = [(7 * i) % 90 + 1 for i in range(95)], [(11 * i) % 90 + 1 for i in range(94)]
FIRST, SECOND, THIRD = SCHEMA + [91] * 5, SCHEMA + [92] * 5, [SCHEMA[0]] + OTHER_SCHEMA + [93] * 5
PROMPTS = [FIRST, FIRST, SECOND, SECOND, THIRD, THIRD]
COMPLETIONS = [[40, 41], [42, 43], [44, 45], [46, 47], [48, 49], [50, 51]]


def shared_prompt_batch(prompts=PROMPTS):
    return collate_rollouts(
        prompts,
        COMPLETIONS,
        [[-1.0, -1.5]] * 6,
        torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0]),
        [False] * 6,
        pad_token_id=0,
    )


def test_neighbours_share_up_to_the_first_loss_column():
    assert adjacent_shared_prefixes(shared_prompt_batch()) == [99, 95, 99, 1, 99]


def test_the_cut_runs_the_fewest_tokens_by_hand():
    assert RUN_COST_TOKENS == 64
    batch = shared_prompt_batch()  # every row 102 tokens; a run of n rows sharing s runs 102n - (n - 1)s
    # at most 6 rows: all six share 1, 607 + 64; [0,4) shares 95 (123) and [4,6) 99 (105), 228 + 2 x 64 = 356;
    # the pairs 3 x 105 + 3 x 64 = 507
    assert micro_batch_slices(batch, 6) == [slice(0, 4), slice(4, 6)]
    # at most 3: the pairs (507) against [0,3) 116 + [3,4) 102 + [4,6) 105 + 3 x 64 = 515
    assert micro_batch_slices(batch, 3) == [slice(0, 2), slice(2, 4), slice(4, 6)]
    # in order, at most micro_batch_size, where the loss is not a sum of rows
    assert micro_batch_slices(batch, 4, follow_prompts=False) == [slice(0, 4), slice(4, 6)]


def test_rows_sharing_little_keep_the_fixed_cut(make_batch):
    batch = make_batch()  # six rows of random prompts: rows 0 and 1 both start with one token
    assert adjacent_shared_prefixes(batch) == [1, 0, 0, 0, 0]
    # two runs either way: the cut after row 1 runs the shared token once
    assert micro_batch_slices(batch, 4) == [slice(0, 2), slice(2, 6)]
    # a third run to save that token costs more than it saves
    assert micro_batch_slices(batch, 3) == [slice(0, 3), slice(3, 6)]
    assert micro_batch_slices(batch, 1) == [slice(i, i + 1) for i in range(6)]


def embedded_tokens(model):
    """A list that counts the tokens each forward of `model` embeds, and the hook's handle."""
    seen = []
    handle = model.get_input_embeddings().register_forward_hook(
        lambda m, args, out: seen.append(args[0].numel())
    )
    return seen, handle


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo"])
def test_the_forward_runs_the_cut_and_the_gradient_is_one_row_at_a_time(make_llama, make_lora, loss_type):
    model, batch = make_lora(make_llama(), perturb=True), shared_prompt_batch()
    loss = LossConfig(loss_type=loss_type)
    grads = []
    for micro_batch_size in (6, 1):
        seen, handle = embedded_tokens(model)
        accumulate_gradients(model, batch, loss, micro_batch_size=micro_batch_size, max_completion_length=2)
        handle.remove()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
        model.zero_grad(set_to_none=True)
        if micro_batch_size == 6:
            # [0,4): its 95-token prefix once, then 4 rows of 7 packed; [4,6): 99, then 2 rows of 3
            assert seen == [95, 28, 99, 6]
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], atol=1e-5, rtol=0)


def test_logprobs_follow_the_cut_and_match_one_row_at_a_time(make_llama, make_lora):
    model, batch = make_lora(make_llama(), perturb=True), shared_prompt_batch()
    seen, handle = embedded_tokens(model)
    together = batch_logprobs(model, batch, micro_batch_size=6)
    handle.remove()
    assert seen == [95, 28, 99, 6]
    torch.testing.assert_close(together, batch_logprobs(model, batch, micro_batch_size=1), atol=1e-5, rtol=0)
