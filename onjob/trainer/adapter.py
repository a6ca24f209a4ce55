"""The model a run trains: the base model plus a LoRA adapter, new or the parent continued.

Checked before the first step, each with a clear error instead of a quiet wrong run:
every configured target names a layer of this family (Phi-3's fused `qkv_proj` is
not `q_proj`); a continued parent has the rank, alpha and targets the settings ask
for (peft would keep the parent's and ignore the settings). Dropout is switched off
everywhere, so the policy at step 0 is the sampler and the ratio starts at exactly 1.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from .errors import BadTargets, ParentMismatch
from .settings import TARGETS, TrainSettings


def load(s: TrainSettings, parent: Path | None, device, dtype):
    """(the peft model, in train mode with no dropout, the base model's directory)."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from .. import bundled

    # peft asks transformers a deprecated question on every load; not the user's concern.
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
    base_dir = s.base_model or bundled.prepare()
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=dtype).to(device)
    if s.gradient_checkpointing:
        base.gradient_checkpointing_enable()
        base.enable_input_require_grads()
    targets = targets_for(base, s.target_modules)
    if parent is not None:
        check_parent(parent, s, targets)
        model = PeftModel.from_pretrained(base, parent, is_trainable=True)
    else:
        config = LoraConfig(
            r=s.lora_rank,
            lora_alpha=s.lora_alpha,
            lora_dropout=0.0,
            target_modules=targets,
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(base, config)
    # Train mode (gradient checkpointing runs only in it), but no dropout anywhere.
    model.train()
    without_dropout(model)
    return model, base_dir


def targets_for(base: torch.nn.Module, configured: list[str] | None) -> list[str] | str:
    """The LoRA targets for this model: the configured ones, each of which must name a
    linear layer of it, else the family's (`settings.TARGETS`), else "all-linear"."""
    names = targets = configured or TARGETS.get(base.config.model_type)
    if targets is None:
        return "all-linear"
    linear = {
        name.rsplit(".", 1)[-1]
        for name, module in base.named_modules()
        if isinstance(module, torch.nn.Linear)
    }
    missing = [t for t in names if t not in linear]
    if missing:
        source = "trainer.target_modules" if configured else f"the {base.config.model_type} list"
        raise BadTargets(
            f"LoRA targets {missing} (from {source}) match no linear layer of "
            f"{type(base).__name__}; its linear layers are {sorted(linear)}"
        )
    return list(targets)


def check_parent(parent: Path, s: TrainSettings, targets: list[str] | str) -> None:
    """The parent adapter must be what the settings describe: continuing it keeps its own
    rank, alpha and targets whatever the settings say."""
    config = json.loads((parent / "adapter_config.json").read_text())
    theirs = config.get("target_modules")
    theirs = sorted(theirs) if isinstance(theirs, list) else theirs
    ours = sorted(targets) if isinstance(targets, list) else targets
    wanted = {"rank": s.lora_rank, "alpha": s.lora_alpha, "targets": ours}
    found = {"rank": config.get("r"), "alpha": config.get("lora_alpha"), "targets": theirs}
    if ours == "all-linear":  # peft writes the layers it expanded "all-linear" into
        del wanted["targets"], found["targets"]
    differ = [k for k in wanted if wanted[k] != found[k]]
    if differ:
        raise ParentMismatch(
            f"the parent adapter {parent} has "
            + ", ".join(f"{k} {found[k]}" for k in differ)
            + "; the settings ask for "
            + ", ".join(f"{k} {wanted[k]}" for k in differ)
            + ". Set trainer.lora_rank / lora_alpha / target_modules to the parent's, or "
            "train a new adapter from the base model (onjob train --parent '')"
        )


def without_dropout(model: torch.nn.Module) -> None:
    """Every dropout off, in train mode: LoRA's and the model's own (`nn.Dropout` modules,
    and attention dropout, which the attention modules read from an attribute)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def name_base(directory: Path, served_base: str | None) -> None:
    """Write `served_base` as the saved adapter's `base_model_name_or_path`: the name an
    engine compares with its own model before it loads an adapter by name (vLLM's LoRA
    resolver, the local engine's), when the engines were started with another path or
    name than the trainer's."""
    if not served_base:
        return
    config_file = Path(directory) / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config["base_model_name_or_path"] = served_base
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True))
