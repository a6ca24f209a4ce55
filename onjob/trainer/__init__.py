"""Offline GRPO on scored groups, writing LoRA checkpoints in PEFT format."""
