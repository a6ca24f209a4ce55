"""One GRPO training run: snapshot in, LoRA checkpoint out. Reads top to bottom.

    groups  = data.load(snapshot)              advantages, masks, the sampler's logprobs
    model   = base + LoRA (new, or the live adapter continued)
    for each step of `groups_per_step` groups:
        for each group, members chunked by length:
            one packed forward: the shared prompt once, each member's own tokens
            logprobs of the sampled tokens (no full-vocabulary log-softmax)
            loss = clipped ratio x advantage, summed / the step's tokens; backward
        clip, step
    save adapter (PEFT format) + onjob-manifest.json + metrics.json

Runs as `onjob train --snapshot S --out DIR` in a child process of the server.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from .data import Group, Sequence, load
from .errors import Diverged, NothingToTrain
from .maths import policy_loss, token_logprobs
from .settings import TARGETS, TrainSettings

MANIFEST = "onjob-manifest.json"


def train(
    snapshot: Path,
    out: Path,
    s: TrainSettings,
    *,
    parent: Path | None = None,
    echo: Callable[[str], None] = print,
    progress: bool = True,
) -> dict:
    started = time.perf_counter()
    torch.set_num_threads(s.threads)
    torch.manual_seed(s.seed)

    # --- data
    groups, notes = load(snapshot, s)
    for line in notes.lines:
        echo(line)
    if not groups:
        raise NothingToTrain(
            f"nothing to train on in {snapshot}: {notes.equal_groups} groups with equal "
            f"scores, {notes.zero_advantage} members at their group's mean, "
            f"{notes.unusable} without token ids"
        )
    groups.sort(key=lambda g: g.id)  # a fixed order for a given snapshot

    # --- model
    device, dtype = _device(s)
    model, base_dir = _model(s, parent, device, dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=s.learning_rate, weight_decay=0.0)
    steps = math.ceil(len(groups) / s.groups_per_step) * s.epochs
    echo(
        f"training on {len(groups)} groups, {sum(len(g.members) for g in groups)} members, "
        f"{sum(g.loss_tokens for g in groups)} tokens: {steps} steps on {device} ({dtype})"
    )
    wandb = _wandb(s)
    if s.sft_epochs:
        sft = _warm_start(model, groups, s, device)
        echo(
            f"warm start: {s.sft_epochs} supervised passes on {sft['members']} best members, "
            f"loss {sft['loss_first']:.3f} -> {sft['loss_last']:.3f}"
        )
    step_done, progress_done = _progress(steps, progress, echo)

    # --- steps
    history, tokens_seen = [], 0
    for epoch in range(s.epochs):
        for first in range(0, len(groups), s.groups_per_step):
            batch = groups[first : first + s.groups_per_step]
            step_tokens = sum(g.loss_tokens for g in batch)
            totals = {"loss": 0.0, "clipped": 0, "ratio": 0.0, "kl": 0.0}
            step_started = time.perf_counter()
            for group in batch:
                for chunk in _chunks(group, s.max_batch_tokens):
                    parts = _loss(model, chunk, s, device)
                    (parts.loss / step_tokens).backward()
                    totals["loss"] += parts.loss.item() / step_tokens
                    totals["clipped"] += parts.clipped
                    totals["ratio"] += parts.ratio_sum
                    totals["kl"] += parts.kl_sum
            grad_norm = torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm).item()
            if not (math.isfinite(totals["loss"]) and math.isfinite(grad_norm)):
                raise Diverged(
                    f"step {len(history) + 1}: loss {totals['loss']}, grad norm {grad_norm}; "
                    "no checkpoint written (lower trainer.learning_rate?)"
                )
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            tokens_seen += step_tokens
            rewards = [m.reward for g in batch for m in g.members]
            record = {
                "step": len(history) + 1,
                "epoch": epoch,
                "loss": totals["loss"],
                "grad_norm": grad_norm,
                "clip_fraction": totals["clipped"] / step_tokens,
                "ratio_mean": totals["ratio"] / step_tokens,
                "kl": totals["kl"] / step_tokens,
                "reward_mean": sum(rewards) / len(rewards),
                "tokens": step_tokens,
                "tokens_per_s": step_tokens / (time.perf_counter() - step_started),
            }
            history.append(record)
            step_done(record)
            if wandb:
                wandb.log(record)
    progress_done()

    # --- checkpoint
    duration = time.perf_counter() - started
    metrics = _summary(history, groups, notes, duration, tokens_seen)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    manifest = {
        "name": out.name,
        "parent": str(parent) if parent else None,
        "base_model": str(base_dir),
        "snapshot_sha256": hashlib.sha256(Path(snapshot).read_bytes()).hexdigest(),
        "config_sha256": hashlib.sha256(s.model_dump_json().encode()).hexdigest(),
        "config": json.loads(s.model_dump_json()),
        "groups": [g.id for g in groups],
        "metrics": metrics,
        "history": history,
        "created": time.time(),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    if wandb:
        wandb.finish()
    echo(
        f"wrote {out}: {metrics['steps']} steps, loss {metrics['loss_last']:.4f}, "
        f"{metrics['tokens_per_s']:.0f} tokens/s, {duration:.1f} s"
    )
    return manifest


def _warm_start(model, groups: list[Group], s: TrainSettings, device) -> dict:
    """Rejection-sampling fine-tuning: the mean negative logprob of each group's best member,
    one optimizer step per `groups_per_step` groups. GRPO can only reinforce what the
    policy samples; this teaches what it samples rarely."""
    best = [max(g.members, key=lambda m: m.reward) for g in groups]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=s.sft_learning_rate, weight_decay=0.0)
    losses = []
    for _ in range(s.sft_epochs):
        for first in range(0, len(best), s.groups_per_step):
            batch = best[first : first + s.groups_per_step]
            tokens = sum(m.loss_tokens for m in batch)
            total = 0.0
            for m in batch:
                loss = -sampled_logprobs(model, [m], device).sum() / tokens
                loss.backward()
                total += loss.item()
            torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(total)
    return {"members": len(best), "loss_first": losses[0], "loss_last": losses[-1]}


def _loss(model, members: list[Sequence], s: TrainSettings, device):
    adv = torch.tensor(
        [m.advantage for m in members for keep in m.loss_mask if keep], device=device
    )
    old = torch.tensor(
        [lp for m in members for lp, keep in zip(m.old_logprobs, m.loss_mask, strict=True) if keep],
        device=device,
    )
    logp = sampled_logprobs(model, members, device)
    ref = None
    if s.kl_beta > 0:
        with torch.no_grad(), model.disable_adapter():
            ref = sampled_logprobs(model, members, device, share_prefix=True)
    return policy_loss(
        logp,
        old,
        adv,
        eps_low=s.eps_low,
        eps_high=s.eps_high,
        kind=s.loss,
        ref_logp=ref,
        beta=s.kl_beta,
    )


def sampled_logprobs(model, members: list[Sequence], device, *, share_prefix: bool = True):
    """The policy's logprob of every loss token of `members`, in order (member by member).

    One forward for all of them, packed into one sequence without padding: the prompt
    they share once, then each member's remaining tokens, with an attention mask that
    lets each member see the shared prompt and its own tokens only (and positions that
    restart after the prompt for each). The prompt's work is done once for the group,
    and the gradient from every member flows back into it. The hidden states become
    logprobs only where there is a loss (`token_logprobs`)."""
    base = model.get_base_model()
    decoder, head = base.model, base.get_output_embeddings()
    prefix = _shared_prefix(members) if share_prefix and len(members) > 1 else 0
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
    seg = torch.tensor(segments, device=device)
    index = torch.arange(len(tokens), device=device)
    visible = (index[None, :] <= index[:, None]) & (
        (seg[None, :] == -1) | (seg[None, :] == seg[:, None])
    )
    hidden = decoder(
        input_ids=torch.tensor([tokens], device=device),
        attention_mask=visible[None, None],
        position_ids=torch.tensor([positions], device=device),
    ).last_hidden_state[0]
    return token_logprobs(
        hidden[torch.tensor(before, device=device)],
        head,
        torch.tensor(targets, device=device),
    )


def _shared_prefix(members: list[Sequence]) -> int:
    """Tokens every member starts with, ending before any member's first loss token."""
    limit = min(m.first_loss for m in members)
    first = members[0].tokens
    n = 0
    while n < limit and all(m.tokens[n] == first[n] for m in members):
        n += 1
    return n


def _chunks(group: Group, max_tokens: int) -> list[list[Sequence]]:
    """A group's members cut so that one packed forward (the shared prompt once, then each
    member's own tokens) holds at most `max_tokens`."""
    prefix = _shared_prefix(group.members) if len(group.members) > 1 else 0
    chunks, current, size = [], [], prefix
    for m in group.members:
        own = len(m.tokens) - prefix
        if current and size + own > max_tokens:
            chunks.append(current)
            current, size = [], prefix
        current.append(m)
        size += own
    return [*chunks, current] if current else chunks


def _device(s: TrainSettings):
    cuda = torch.cuda.is_available() and s.device != "cpu"
    if s.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device = cuda but no CUDA device is available")
    device = torch.device("cuda" if cuda else "cpu")
    if s.dtype == "auto":
        dtype = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float32
    else:
        dtype = getattr(torch, s.dtype)
    return device, dtype


def _model(s: TrainSettings, parent: Path | None, device, dtype):
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
    if parent is not None:
        model = PeftModel.from_pretrained(base, parent, is_trainable=True)
    else:
        targets = s.target_modules or TARGETS.get(base.config.model_type, "all-linear")
        config = LoraConfig(
            r=s.lora_rank,
            lora_alpha=s.lora_alpha,
            lora_dropout=s.lora_dropout,
            target_modules=targets,
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(base, config)
    model.train()
    return model, base_dir


def _summary(history: list[dict], groups, notes, duration: float, tokens: int) -> dict:
    return {
        "steps": len(history),
        "groups": len(groups),
        "members": sum(len(g.members) for g in groups),
        "skipped_equal_groups": notes.equal_groups,
        "loss_first": history[0]["loss"],
        "loss_last": history[-1]["loss"],
        "reward_mean": sum(h["reward_mean"] for h in history) / len(history),
        "clip_fraction": sum(h["clip_fraction"] for h in history) / len(history),
        "kl": sum(h["kl"] for h in history) / len(history),
        "tokens": tokens,
        "tokens_per_s": tokens / duration,
        "duration_s": duration,
    }


def _progress(total: int, enabled: bool, echo):
    """A bar on a terminal; in a log (the training child of `onjob serve`) a line per step."""
    if not enabled:
        return (lambda record: None), (lambda: None)
    if not sys.stderr.isatty():

        def line(r: dict) -> None:
            echo(
                f"step {r['step']}/{total}: loss {r['loss']:.4f}, reward {r['reward_mean']:.2f}, "
                f"{r['tokens_per_s']:.0f} tokens/s"
            )

        return line, (lambda: None)
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc="grpo", unit="step")

    def update(r: dict) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{r['loss']:.4f}", reward=f"{r['reward_mean']:.2f}")

    return update, bar.close


def _wandb(s: TrainSettings):
    if not s.wandb_project:
        return None
    try:
        import wandb
    except ImportError:
        print("trainer.wandb_project is set but wandb is not installed: not logging to W&B")
        return None
    wandb.init(project=s.wandb_project, config=s.model_dump(mode="json"), dir=os.getcwd())
    return wandb
