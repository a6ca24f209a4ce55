"""The GRPO maths, in one place: advantages, token logprobs, and the clipped policy loss.

Shapes: a batch is a flat set of loss tokens (the assistant tokens the policy
sampled), each with its member's advantage, the sampler's logged logprob, and the
current policy's logprob.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch.utils.checkpoint import checkpoint


def advantages(
    rewards: list[float],
    *,
    normalize_std: bool = False,
    std_floor: float = 0.1,
    baseline: list[bool] | None = None,
) -> list[float]:
    """Group-relative advantages of one group's members: reward minus the baseline, the
    mean reward of the members marked in `baseline` (default: all of them).

    Unnormalised by default (Dr. GRPO, Liu et al. 2025): dividing by the group's std
    turns judge noise into full-size advantages (0.80 vs 0.81 becomes +-1) and weights
    easy and hard prompts differently. With `normalize_std`, the divisor is the
    baseline members' (population) std, never below `std_floor`.

    A member outside the baseline (the logged answer of a turn group sampled under the
    client's temperature, its rivals under the judge's) gets an advantage against the
    others' mean but does not move it: the baseline is the expected reward of one
    sampling distribution."""
    r = torch.tensor(rewards, dtype=torch.float64)
    inside = torch.tensor(baseline if baseline is not None else [True] * len(rewards))
    if not inside.any():
        inside = torch.ones_like(inside)
    centred = r - r[inside].mean()
    if normalize_std:
        centred = centred / max(r[inside].std(unbiased=False).item(), std_floor, 1e-12)
    return centred.tolist()


def token_logprobs(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    targets: torch.Tensor,
    chunk: int | None = None,
) -> torch.Tensor:
    """log p(target) for each row of `hidden` [N, H], without a full-vocabulary log-softmax
    kept for backward: `head` (hidden -> fp32 logits) runs on the rows that have a loss
    only, `chunk` rows at a time, and each chunk is recomputed in backward instead of
    stored, so memory holds one chunk's logits, not [N, vocab] (16k tokens x 49k vocab
    in fp32 is 3.2 GB). Each row needs only its target's logit and its logsumexp."""
    if hidden.shape[0] == 0:
        return hidden.new_zeros(0, dtype=torch.float32)
    if chunk is None:  # ~128 MB of fp32 logits at a time, whatever the vocabulary
        with torch.no_grad():
            chunk = max(16, 2**25 // head(hidden[:1]).shape[-1])

    def picked(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logits = head(h)
        return logits.gather(-1, t[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)

    out = []
    for start in range(0, hidden.shape[0], chunk):
        h, t = hidden[start : start + chunk], targets[start : start + chunk]
        if torch.is_grad_enabled() and h.requires_grad:
            out.append(checkpoint(picked, h, t, use_reentrant=False))
        else:
            out.append(picked(h, t))
    return torch.cat(out)


@dataclass
class LossParts:
    loss: torch.Tensor  # summed over tokens: divide by the step's token count
    clipped: float  # tokens whose ratio was clipped
    ratio_sum: float
    kl_sum: float


# exp() of a log ratio above this is past any clip, and e^20 ~ 5e8 is still finite in fp32:
# one token whose logged logprob disagrees wildly with the policy cannot make the loss inf.
MAX_LOG_RATIO = 20.0


def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per token, Schulman's k3 estimate of KL(policy ‖ reference) at sampled tokens:
    exp(ref - logp) - (ref - logp) - 1, never negative, unbiased when the tokens were
    sampled from the policy (`k3_of_sampled` for tokens another policy sampled)."""
    diff = (ref_logp - logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return torch.exp(diff) - diff - 1


# The largest weight one token of another sampler's answer gets in `k3_of_sampled`.
MAX_KL_WEIGHT = 5.0


def k3_of_sampled(
    logp: torch.Tensor, ref_logp: torch.Tensor, sampler_logp: torch.Tensor
) -> tuple[float, float]:
    """k3(policy ‖ reference) on tokens another policy sampled: each token's k3 weighted
    by policy / sampler (capped at `MAX_KL_WEIGHT`); (weighted sum, sum of weights), whose
    ratio is the per-token estimate. Unweighted, a token the policy learned to avoid
    counts exp(ref - logp), which grows without bound as the policy drops it, however
    little probability the policy moved (docs/benchmarks.md: the offline benchmark)."""
    weight = torch.exp((logp - sampler_logp).clamp(max=math.log(MAX_KL_WEIGHT)))
    return (weight * k3(logp, ref_logp)).sum().item(), weight.sum().item()


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantage: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float = 3.0,
    kind: Literal["ppo", "cispo"] = "ppo",
    cispo_max_weight: float = 5.0,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
) -> LossParts:
    """Token-level clipped objective, summed (the caller divides by all tokens of the step).

    r = exp(clamp(logp - old_logp, -20, 20))
    ppo:   -min(r·A, clip(r, 1-eps_low, 1+eps_high)·A), and for A < 0 at least -dual_clip·A
           (dual clip, Ye et al. 2020: with a negative advantage the min above is
           unbounded as r grows; past `dual_clip` the token's loss is constant, so one
           token the sampler found unlikely cannot dominate the step)
    cispo: -sg(min(r, cispo_max_weight))·A·logp  (the weight is capped, never the gradient
           dropped: tokens outside the trust region still teach, scaled; only the top is
           capped, as in MiniMax-M1's CISPO, TRL's `epsilon_high` and ART's [0, 5]: PPO's
           0.8-1.2 band would make every token's weight nearly 1)
    plus beta · k3(policy ‖ reference), k3 = exp(ref - logp) - (ref - logp) - 1.
    """
    ratio = torch.exp((logp - old_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    clipped_ratio = ratio.clamp(1 - eps_low, 1 + eps_high)
    outside = (ratio < 1 - eps_low) | (ratio > 1 + eps_high)
    if kind == "ppo":
        per_token = -torch.minimum(ratio * advantage, clipped_ratio * advantage)
        per_token = torch.where(
            advantage < 0, torch.minimum(per_token, -dual_clip * advantage), per_token
        )
    elif kind == "cispo":
        per_token = -ratio.clamp(max=cispo_max_weight).detach() * advantage * logp
        outside = ratio > cispo_max_weight
    else:  # a caller's bug: TrainSettings.loss admits no other
        raise ValueError(f"unknown loss {kind!r} (ppo or cispo)")
    kl = torch.zeros_like(logp)
    if ref_logp is not None and beta > 0:
        kl = k3(logp, ref_logp)
        per_token = per_token + beta * kl
    return LossParts(
        loss=per_token.sum(),
        clipped=outside.sum().item(),
        ratio_sum=ratio.detach().sum().item(),
        kl_sum=kl.detach().sum().item(),
    )
