"""The policy's logprob of every sampled token: packed forwards, their mask, and the head.

    chunks   = a group's members packed while a forward stays short; a long member alone
    hidden   = the model's decoder on the chunk          (its own layers, norms, RoPE)
    logprob  = head(hidden where a sampled token is predicted)   fp32, the model's own
               logit transforms, a slice of rows at a time, recomputed in backward

Why each part is the way it is:

- A packed forward lets several members see one shared prompt. That needs an attention
  mask of our own, and transformers passes a 4-D mask through untouched: a boolean one
  is *added* to the scores by eager attention (True -> +1.0, nothing masked; Gemma-2
  runs eager). So the mask is additive float (0 or the dtype's minimum), which eager and
  SDPA read alike. A packed forward is never longer than the model's sliding window, so
  the window never cuts inside it and one mask is right for every layer type.
- A member alone runs with no mask of ours: the model builds its own causal and
  sliding-window masks (and may use flash kernels), so memory grows linearly with length.
- The decoder's output goes through the head the model's own `forward` applies:
  `lm_head`, then Gemma-2's final soft-capping, Granite's `logits_scaling`, Cohere's
  `logit_scale`. `Head.check` compares it with the model's `forward` on a probe at the
  start of a run, so a family with another transform is refused, not mistrained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .data import Group, Sequence
from .errors import UnsupportedModel
from .maths import token_logprobs

# Attention implementations that read a 4-D float mask as it is given.
_MASKABLE = ("eager", "sdpa")


@dataclass(frozen=True)
class Head:
    """The model's head, in fp32: `lm_head`, then the family's transform of the logits.

    fp32 because the importance ratio divides two probabilities: a bf16 head moves
    logprobs by ~1e-2, which is the whole trust region of a ratio clipped at 1 +- 0.2
    after a few tokens."""

    linear: torch.nn.Module
    softcap: float | None = None  # Gemma-2: cap * tanh(logits / cap)
    scale: float = 1.0  # Granite: 1 / logits_scaling; Cohere: logit_scale

    @classmethod
    def of(cls, model: torch.nn.Module) -> Head:
        config = model.config
        scale = 1.0 / (getattr(config, "logits_scaling", None) or 1.0)
        scale *= getattr(config, "logit_scale", None) or 1.0
        return cls(
            model.get_output_embeddings(),
            softcap=getattr(config, "final_logit_softcapping", None),
            scale=scale,
        )

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        linear = self.linear
        if type(linear) is torch.nn.Linear:
            bias = linear.bias.float() if linear.bias is not None else None
            logits = F.linear(hidden.float(), linear.weight.float(), bias)
        else:  # a head with an adapter on it: its own forward, then fp32
            logits = linear(hidden).float()
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def check(self, model: torch.nn.Module, device, *, tolerance: float) -> float:
        """The largest gap between this head's log-softmax and the model's own `forward` on
        a short probe; a gap above `tolerance` means the family transforms its logits in a
        way this head does not, and training on it would be wrong: refused."""
        vocab = self.linear.weight.shape[0]
        probe = torch.arange(1, 17, device=device)[None] * 7919 % vocab
        with torch.no_grad():
            own = model(input_ids=probe, use_cache=False).logits[0].float().log_softmax(-1)
            hidden = decoder_of(model)(input_ids=probe, use_cache=False).last_hidden_state[0]
            ours = self(hidden).log_softmax(-1)
        gap = (own - ours).abs().max().item()
        if not gap <= tolerance:
            raise UnsupportedModel(
                f"{type(model).__name__} ({model.config.model_type}): its forward's logits "
                f"differ from lm_head + the known transforms by {gap:.3g} (allowed "
                f"{tolerance:g}); this family transforms its logits in a way the trainer "
                "does not know"
            )
        return gap


@dataclass(frozen=True)
class Policy:
    """What a forward pass needs: the model being trained, its head in float32, the
    tokens packed into one forward at most, the device."""

    model: Any
    head: Head
    limit: int
    device: Any


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack under a causal LM (under its LoRA wrapper, if any)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder()


def pack_limit(model: torch.nn.Module, max_tokens: int) -> int:
    """The longest packed forward that is exact for this model: at most `max_tokens`, no
    longer than its smallest attention window, and 0 (never pack) when its attention
    implementation does not read our mask."""
    config = model.config
    if getattr(config, "_attn_implementation", "eager") not in _MASKABLE:
        return 0
    windows = [getattr(config, k, None) for k in ("sliding_window", "attention_chunk_size")]
    return min([max_tokens, *(w for w in windows if isinstance(w, int) and w > 0)])


def shared_prefix(members: list[Sequence]) -> int:
    """Tokens every member starts with, ending before any member's first loss token."""
    limit = min(m.first_loss for m in members)
    first = members[0].tokens
    n = 0
    while n < limit and all(m.tokens[n] == first[n] for m in members):
        n += 1
    return n


def chunks(group: Group, limit: int) -> list[list[Sequence]]:
    """A group's members cut so that one packed forward (the shared prompt once, then each
    member's own tokens) holds at most `limit` tokens; a member longer than that runs
    alone, unpacked."""
    prefix = shared_prefix(group.members) if len(group.members) > 1 else 0
    out, current, size = [], [], prefix
    for m in group.members:
        own = len(m.tokens) - prefix
        if current and size + own > limit:
            out.append(current)
            current, size = [], prefix
        current.append(m)
        size += own
    return [*out, current] if current else out


def sampled_logprobs(
    model, head: Head, members: list[Sequence], device, *, share_prefix: bool = True
) -> torch.Tensor:
    """The policy's logprob of every loss token of `members`, in order (member by member).

    One member: its tokens as they are, through the model's own masks. Several: one
    forward packed without padding, the prompt they share once, then each member's
    remaining tokens, each member seeing the shared prompt and itself only, with
    positions that restart after the prompt. The prompt's work is done once for the
    group, and every member's gradient flows back into it."""
    decoder = decoder_of(model)
    if len(members) == 1:
        (m,) = members
        before = [t - 1 for t in range(1, len(m.tokens)) if m.loss_mask[t]]
        targets = [m.tokens[t + 1] for t in before]
        hidden = decoder(
            input_ids=torch.tensor([m.tokens], device=device), use_cache=False
        ).last_hidden_state[0]
    else:
        prefix = shared_prefix(members) if share_prefix else 0
        tokens, positions = list(members[0].tokens[:prefix]), list(range(prefix))
        segments = [-1] * prefix  # -1: the shared prompt; i: member i's own tokens
        before, targets = [], []  # per loss token: the packed index of the state predicting it
        for i, m in enumerate(members):
            start = len(tokens)
            tokens += m.tokens[prefix:]
            positions += range(prefix, len(m.tokens))
            segments += [i] * (len(m.tokens) - prefix)
            for t in range(max(prefix, 1), len(m.tokens)):
                if m.loss_mask[t]:
                    before.append(start + t - prefix - 1 if t > prefix else prefix - 1)
                    targets.append(m.tokens[t])
        dtype = next(decoder.parameters()).dtype
        hidden = decoder(
            input_ids=torch.tensor([tokens], device=device),
            attention_mask=packed_mask(torch.tensor(segments, device=device), dtype),
            position_ids=torch.tensor([positions], device=device),
            use_cache=False,
        ).last_hidden_state[0]
    return token_logprobs(
        hidden[torch.tensor(before, device=device, dtype=torch.long)],
        head,
        torch.tensor(targets, device=device, dtype=torch.long),
    )


def packed_mask(segments: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, L, L] additive mask: 0 where query i may see key j (j <= i, and j is in the
    shared prompt or in i's own member), the dtype's minimum elsewhere. Float, never
    boolean: eager attention adds whatever it is given to the scores."""
    index = torch.arange(len(segments), device=segments.device)
    visible = (index[None, :] <= index[:, None]) & (
        (segments[None, :] == -1) | (segments[None, :] == segments[:, None])
    )
    mask = torch.zeros(visible.shape, dtype=dtype, device=segments.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[None, None]


def sampler_logprobs(members: list[Sequence], device) -> torch.Tensor:
    """The sampler's logged logprob of every loss token of `members`, in
    `sampled_logprobs`' order."""
    return torch.tensor(
        [lp for m in members for lp, keep in zip(m.old_logprobs, m.loss_mask, strict=True) if keep],
        device=device,
        dtype=torch.float32,
    )
