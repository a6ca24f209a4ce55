"""A rank-8 LoRA checkpoint on q_proj and v_proj as peft writes the trainer's, its B
matrices drawn at random (`std`) so it changes the model's outputs: the adapters the
engine benchmarks load."""

from __future__ import annotations

from pathlib import Path


def random_adapter(model: Path, out: Path, *, seed: int, std: float) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    peft_model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model),
        LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    )
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=std)
    peft_model.save_pretrained(out)
    return out
