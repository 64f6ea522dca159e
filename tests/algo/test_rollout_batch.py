"""collate_rollouts lays tokens out as rl.algo.batch documents; RolloutBatch rejects misaligned tensors."""

import pytest
import torch

from rl.algo.batch import RolloutBatch, collate_rollouts


def test_layout_by_hand():
    batch = collate_rollouts(
        prompt_ids=[[5, 6], [7]],
        completion_ids=[[8, 9, 10], [11, 12]],
        completion_logprobs=[[-0.1, -0.2, -0.3], [-0.4, -0.5]],
        advantages=torch.tensor([[1.0, -1.0]]),
        truncated=[True, False],
        pad_token_id=0,
        completion_masks=[[1, 0, 1], [1, 1]],
    )
    assert batch.input_ids.tolist() == [[5, 6, 8, 9, 10], [7, 11, 12, 0, 0]]
    assert batch.attention_mask.tolist() == [[True] * 5, [True, True, True, False, False]]
    assert batch.loss_mask.tolist() == [[False, False, True, False, True], [False, True, True, False, False]]
    torch.testing.assert_close(
        batch.sampling_logprobs, torch.tensor([[0, 0, -0.1, -0.2, -0.3], [0, -0.4, -0.5, 0, 0]])
    )
    assert batch.advantages.tolist() == [1.0, -1.0]
    assert batch.completion_lengths.tolist() == [3, 2]
    assert batch.truncated.tolist() == [True, False]


def test_rows_trim_trailing_padding():
    batch = collate_rollouts(
        [[1], [2, 3, 4]], [[5], [6, 7]], [[-1.0], [-1.0, -2.0]], torch.ones(2), [False] * 2, 0
    )
    first = batch.rows(0, 1)
    assert first.input_ids.tolist() == [[1, 5]]
    assert batch.rows(0, 2).input_ids.shape == (2, 5)


def test_misaligned_tensors_are_named():
    ok = dict(
        input_ids=torch.ones(2, 4, dtype=torch.long),
        attention_mask=torch.ones(2, 4),
        loss_mask=torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]]),
        sampling_logprobs=torch.zeros(2, 4),
        advantages=torch.zeros(2),
        completion_lengths=torch.tensor([3, 2]),
        truncated=torch.zeros(2),
    )
    RolloutBatch(**ok)
    with pytest.raises(ValueError, match="sampling_logprobs has shape"):
        RolloutBatch(**{**ok, "sampling_logprobs": torch.zeros(2, 3)})
    with pytest.raises(ValueError, match="advantages has shape"):
        RolloutBatch(**{**ok, "advantages": torch.zeros(2, 1)})
    with pytest.raises(ValueError, match="loss_mask marks padding or position 0"):
        RolloutBatch(**{**ok, "loss_mask": torch.ones(2, 4)})
    with pytest.raises(ValueError, match="non-empty prompt"):
        collate_rollouts([[]], [[1]], [[-1.0]], torch.ones(1), [False], 0)
