"""The trainer tests' tiny Llama (vocab 97) with a LoRA adapter, and a hand-laid rollout batch."""

import torch
from peft import LoraConfig, get_peft_model

from rl.algo.batch import collate_rollouts

VOCAB = 97
PROMPT_LENGTHS = [3, 2, 4, 2, 3, 5]
COMPLETION_LENGTHS = [4, 6, 3, 5, 2, 4]
TRUNCATED = [False, True, False, False, True, False]
# row 3 is multi-turn: its completion tokens 1 and 2 are an environment observation
OBSERVATION = {3: (1, 3)}
ADVANTAGES = [0.5, -1.0, 1.5, 0.25, -0.75, 1.0]


def with_lora(model: torch.nn.Module, perturb: bool) -> torch.nn.Module:
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "up_proj"])
    peft_model = get_peft_model(model, cfg)
    if perturb:
        # peft starts lora_B at zero (policy == base); move it so the two differ
        torch.manual_seed(1)
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.data.normal_(0.0, 0.2)
    return peft_model


def rollout_batch(advantages=ADVANTAGES, truncated=TRUNCATED):
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(1, VOCAB, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]
    completions = [torch.randint(1, VOCAB, (n,), generator=gen).tolist() for n in COMPLETION_LENGTHS]
    masks = [[1] * n for n in COMPLETION_LENGTHS]
    for row, (start, stop) in OBSERVATION.items():
        masks[row][start:stop] = [0] * (stop - start)
    logprobs = [(-torch.rand(n, generator=gen) * 3).tolist() for n in COMPLETION_LENGTHS]
    return collate_rollouts(
        prompts,
        completions,
        logprobs,
        torch.tensor(advantages),
        truncated,
        pad_token_id=0,
        completion_masks=masks,
    )
