"""pagedrl entry point: `python train.py [group=option ...] [key=value ...]` (Hydra)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from rl.config import register_configs
from rl.models import load_model

register_configs()

DEMO_MESSAGES = [
    {"role": "system", "content": "You translate questions into SQLite queries. Answer with one SQL query."},
    {"role": "user", "content": "Table employees(id, name, salary). List the names of employees earning over 5000."},
]


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    model, tokenizer = load_model(
        cfg.model.name.value, path=cfg.model.path, dtype=cfg.model.dtype.value, device=cfg.model.device,
        seed=cfg.model.seed,
    )
    prompt = tokenizer.apply_chat_template(DEMO_MESSAGES, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    output = model.generate(**prompt.to(model.device), max_new_tokens=48, do_sample=False)
    print(tokenizer.decode(output[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True))


if __name__ == "__main__":
    main()
