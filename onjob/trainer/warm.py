"""The warm start (`trainer.sft_epochs`): rejection-sampling fine-tuning before GRPO.

GRPO can only reinforce what the policy samples; this teaches what it samples rarely:
the mean negative logprob of each group's best member, one optimizer step per
`groups_per_step` groups, with an AdamW of its own (GRPO's moments start after it).
It moves the policy, so it runs after the sampler check.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .data import Group
from .forward import Policy, sampled_logprobs
from .ranks import Ranks
from .settings import TrainSettings


@dataclass(frozen=True)
class WarmStart:
    """What the warm start did, for its progress line: the members it fitted, its first
    and last step's loss."""

    members: int
    loss_first: float
    loss_last: float

    def said(self, epochs: int) -> str:
        return (
            f"warm start: {epochs} supervised passes on {self.members} best members, "
            f"loss {self.loss_first:.3f} -> {self.loss_last:.3f}"
        )


def warm_start(policy: Policy, groups: list[Group], s: TrainSettings, ranks: Ranks) -> WarmStart:
    best = [max(g.members, key=lambda m: m.reward) for g in groups]
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=s.sft_learning_rate, weight_decay=0.0)
    losses = []
    for _ in range(s.sft_epochs):
        for first in range(0, len(best), s.groups_per_step):
            batch = best[first : first + s.groups_per_step]
            tokens = sum(m.loss_tokens for m in batch)
            total = 0.0
            for m in ranks.share(batch):
                logp = sampled_logprobs(policy.model, policy.head, [m], policy.device)
                loss = -logp.sum() / tokens
                loss.backward()
                total += loss.item()
            total = ranks.sum({"loss": total})["loss"]
            ranks.sum_gradients(params)
            torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(total)
    return WarmStart(len(best), losses[0], losses[-1])
