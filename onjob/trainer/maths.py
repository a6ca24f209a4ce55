"""The GRPO maths, in one place: advantages, token logprobs, and the clipped policy loss.

Shapes: a batch is a flat set of loss tokens (the assistant tokens the policy
sampled), each with its member's advantage, the sampler's logged logprob, and the
current policy's logprob.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def advantages(
    rewards: list[float], *, normalize_std: bool = True, eps: float = 1e-6
) -> list[float]:
    """Group-relative advantages of one group's members: reward minus the group's mean,
    divided by the group's (population) standard deviation unless `normalize_std` is off."""
    r = torch.tensor(rewards, dtype=torch.float64)
    centred = r - r.mean()
    if normalize_std:
        centred = centred / (r.std(unbiased=False) + eps)
    return centred.tolist()


def token_logprobs(
    hidden: torch.Tensor, lm_head: torch.nn.Module, targets: torch.Tensor, chunk: int = 1024
) -> torch.Tensor:
    """log p(target) for each row of `hidden` [N, H], without a full-vocabulary log-softmax:
    the head runs on the rows that have a loss only, `chunk` rows at a time, and each
    row needs only its target's logit and the logsumexp of its logits."""
    out = []
    for start in range(0, hidden.shape[0], chunk):
        logits = lm_head(hidden[start : start + chunk]).float()
        picked = logits.gather(-1, targets[start : start + chunk, None]).squeeze(-1)
        out.append(picked - torch.logsumexp(logits, dim=-1))
    return torch.cat(out) if out else hidden.new_zeros(0)


@dataclass
class LossParts:
    loss: torch.Tensor  # summed over tokens: divide by the step's token count
    clipped: float  # tokens whose ratio was clipped
    ratio_sum: float
    kl_sum: float
    tokens: int


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantage: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    kind: str = "ppo",
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
) -> LossParts:
    """Token-level clipped objective, summed (the caller divides by all tokens of the step).

    ppo:   -min(r·A, clip(r, 1-eps_low, 1+eps_high)·A), r = exp(logp - old_logp)
    cispo: -sg(clip(r, 1-eps_low, 1+eps_high))·A·logp  (the weight is clipped, never the
           gradient dropped: tokens outside the trust region still teach, scaled)
    plus beta · k3(policy ‖ reference), k3 = exp(ref - logp) - (ref - logp) - 1.
    """
    ratio = torch.exp(logp - old_logp)
    clipped_ratio = ratio.clamp(1 - eps_low, 1 + eps_high)
    if kind == "ppo":
        per_token = -torch.minimum(ratio * advantage, clipped_ratio * advantage)
    elif kind == "cispo":
        per_token = -clipped_ratio.detach() * advantage * logp
    else:
        raise ValueError(f"unknown loss {kind!r} (ppo or cispo)")
    kl = torch.zeros_like(logp)
    if ref_logp is not None and beta > 0:
        diff = ref_logp - logp
        kl = torch.exp(diff) - diff - 1
        per_token = per_token + beta * kl
    with torch.no_grad():
        clipped = ((ratio < 1 - eps_low) | (ratio > 1 + eps_high)).sum().item()
    return LossParts(
        loss=per_token.sum(),
        clipped=clipped,
        ratio_sum=ratio.detach().sum().item(),
        kl_sum=kl.detach().sum().item(),
        tokens=logp.numel(),
    )
