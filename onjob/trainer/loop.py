"""One GRPO training run: snapshot in, LoRA checkpoint out. Reads top to bottom.

    groups  = data.load(snapshot)              advantages, masks, the sampler's logprobs
    model   = base + LoRA (new, or the live adapter continued), no dropout
    optimizer = AdamW, its moments continued from the parent's `optimizer.pt` if any;
                the learning rate warmed up linearly over `warmup_steps`
    for each step of `groups_per_step` groups:
        for each group, members chunked by length (forward.chunks):
            one packed forward: the shared prompt once, each member's own tokens
            logprobs of the sampled tokens (fp32 head, no full-vocabulary log-softmax kept)
            check, on a group's first forward: its logprobs against the logged ones (at
              step 0 the same weights); a group they disagree on is skipped and recorded
            loss = clipped ratio x advantage, summed / the step's tokens; backward
        clip, step (a step whose gradient is not finite is dropped, its groups recorded)
    kl_to_base = k3(policy ‖ base) per token on a few groups' tokens, each weighted by
              policy / sampler: how far the checkpoint (its whole lineage) moved from
              the base model, for the guard `loop.max_kl_to_base`
    kl_to_base_own = the same on answers the trained policy samples itself from the
              groups' prompts: drift where the candidate now goes, which the old
              sampler's tokens do not show (the guard reads the larger)
    save adapter (PEFT format) + optimizer.pt + onjob-manifest.json

Runs as `onjob train --snapshot S --out DIR` in a child process of the server, or as a
job of its own on another host; under `torchrun --nproc-per-node N` each rank computes
its share of every step's groups and the gradients are summed before the step
(`ranks.py`: data parallel, the weights equal on every rank), and rank 0 writes.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import torch

from . import adapter
from .data import Group, Notes, Sequence, load
from .errors import Diverged, NoDevice, NothingToTrain
from .foreign import translated
from .forward import Head, chunks, decoder_of, pack_limit, sampled_logprobs
from .manifest import Dropped, Manifest, Metrics, Precision, Step
from .maths import LossParts, k3, k3_of_sampled, policy_loss, token_logprobs
from .ranks import Ranks
from .settings import TrainSettings

OPTIMIZER = "optimizer.pt"  # AdamW's state beside the adapter: the next run of the lineage


def train(
    snapshot: Path,
    out: Path,
    s: TrainSettings,
    *,
    parent: Path | None = None,
    echo: Callable[[str], None] = print,
    progress: bool = True,
) -> Manifest | None:
    """The run; its manifest (None on a rank other than the first, which writes). Every
    failure it expects is a `TrainerError`."""
    with translated():
        return _train(snapshot, out, s, parent=parent, echo=echo, progress=progress)


def _train(
    snapshot: Path,
    out: Path,
    s: TrainSettings,
    *,
    parent: Path | None,
    echo: Callable[[str], None],
    progress: bool,
) -> Manifest | None:
    started = time.perf_counter()
    device, dtype, ranks = _machine(s)
    if not ranks.main:
        echo = _quiet  # one rank speaks for the run

    # --- data (every rank reads the whole snapshot; each computes its share of a step)
    groups, notes = _groups(snapshot, s, echo)

    # --- model
    model, base_dir = adapter.load(s, parent, device, dtype)
    head = Head.of(model.get_base_model())
    policy = Policy(model, head, pack_limit(model, s.max_batch_tokens), device)
    precision = _precision(model, head, device, dtype)

    # --- optimizer: a lineage's moments carry on (a fresh AdamW's first steps move every
    # parameter by about the learning rate, in the sign of a gradient of a few groups)
    params = [p for p in model.parameters() if p.requires_grad]
    ranks.same_start(params)
    optimizer = _optimizer(model, params, s, parent, echo)
    steps = math.ceil(len(groups) / s.groups_per_step) * s.epochs
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup(s.warmup_steps))
    echo(
        f"training on {len(groups)} groups, {sum(len(g.members) for g in groups)} members, "
        f"{sum(g.loss_tokens for g in groups)} tokens: {steps} steps on {device} ({dtype})"
        + (f", {ranks.world} ranks" if ranks.many else "")
    )
    skipped, gaps = _before_steps(policy, groups, notes, s, ranks, echo)
    wandb = _wandb(s) if ranks.main else None
    history, tokens_seen, dropped = _steps(
        policy, groups, s, ranks, (params, optimizer, schedule), skipped, gaps,
        _progress(steps, progress and ranks.main, echo), wandb, echo,
    )  # fmt: skip
    for theirs in ranks.gather(gaps):
        gaps.update(theirs)
    weight_gap = ranks.largest_difference(params)
    if not ranks.main:
        ranks.close()
        return None
    groups = [g for g in groups if g.id not in skipped]
    if not groups:
        raise NothingToTrain(f"nothing to train on in {snapshot}: every group was skipped")
    if not history:
        raise Diverged(
            f"all {len(dropped)} steps had a loss or gradient that is not finite; no checkpoint "
            "written (lower trainer.learning_rate?)"
        )

    # --- checkpoint
    drift = (
        _kl_to_base(model, head, groups, policy.limit, device),
        _kl_on_own_samples(model, head, groups[: s.kl_own_prompts], device),
    )
    duration = time.perf_counter() - started
    summary = _summary(history, groups, notes, duration, tokens_seen)
    metrics = _with_checks(summary, gaps, drift, len(skipped), dropped, ranks.world, weight_gap)
    manifest = _write(out, model, optimizer, s, parent, base_dir, snapshot, groups, skipped,
                      precision, metrics, history)  # fmt: skip
    if wandb:
        wandb.finish()
    ranks.close()
    echo(
        f"wrote {out}: {metrics.steps} steps, loss {metrics.loss_last:.4f}, "
        f"{metrics.tokens_per_s:.0f} tokens/s, {duration:.1f} s"
    )
    return manifest


def _precision(model, head: Head, device, dtype) -> Precision:
    """How the run computes, for the manifest; the head checked against the model's own."""
    return Precision(
        device=str(device),
        model_dtype=str(dtype),
        head_dtype=str(torch.float32),
        attention=model.config._attn_implementation,
        head_check_gap=head.check(
            model, device, tolerance=1e-3 if dtype == torch.float32 else 0.25
        ),
    )


def _before_steps(
    policy: Policy, groups: list[Group], notes: Notes, s: TrainSettings, ranks: Ranks, echo
) -> tuple[dict, dict[str, Gap]]:
    """The groups skipped so far and the gaps measured so far. The check that the policy
    starts where the sampler was runs on each group's first forward, folded into
    training (a separate pass cost a forward per group); with a warm start the policy
    moves first, so the check runs before it, on its own."""
    skipped = dict(notes.skipped)
    gaps: dict[str, Gap] = {}
    if s.sft_epochs:
        model, head = policy.model, policy.head
        gaps = {g.id: _gap(g, model, head, policy.limit, policy.device) for g in groups}
        for group in groups:
            _check(group, gaps[group.id], s, skipped, echo)
        sft = _warm_start(model, head, groups, s, policy.device, ranks)
        echo(
            f"warm start: {s.sft_epochs} supervised passes on {sft.members} best members, "
            f"loss {sft.loss_first:.3f} -> {sft.loss_last:.3f}"
        )
    return skipped, gaps


def _steps(
    policy: Policy,
    groups: list[Group],
    s: TrainSettings,
    ranks: Ranks,
    optimizing: tuple,
    skipped: dict,
    gaps: dict[str, Gap],
    progress: tuple,
    wandb,
    echo,
) -> tuple[list[Step], int, list[Dropped]]:
    """The run's steps, `groups_per_step` groups each, every epoch: the history of the
    steps applied, the tokens they trained on, and the steps dropped."""
    params, optimizer, schedule = optimizing
    step_done, progress_done = progress
    history: list[Step] = []
    dropped: list[Dropped] = []
    tokens_seen = 0
    for epoch in range(s.epochs):
        for first in range(0, len(groups), s.groups_per_step):
            batch = groups[first : first + s.groups_per_step]
            # (A group the check skips during this step keeps its tokens here: rare, and
            # the others' gradient is then a little smaller.)
            step_tokens = sum(g.loss_tokens for g in batch if g.id not in skipped)
            step_started = time.perf_counter()
            totals, trained = _backward(policy, batch, s, ranks, step_tokens, skipped, gaps,
                                        len(history), echo)  # fmt: skip
            if not trained:
                continue  # every group of the step was skipped: no step
            ranks.sum_gradients(params)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm).item()
            if not (math.isfinite(totals["loss"]) and math.isfinite(grad_norm)):
                # Not applied, recorded, and the run goes on with the other steps.
                optimizer.zero_grad(set_to_none=True)
                dropped.append(_dropped(epoch, batch, totals["loss"], grad_norm, echo))
                continue
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            schedule.step()
            tokens_seen += step_tokens
            record = _record(len(history) + 1, epoch, totals, grad_norm, lr, trained,
                             step_tokens, time.perf_counter() - step_started)  # fmt: skip
            history.append(record)
            step_done(record)
            if wandb:
                wandb.log(msgspec.to_builtins(record))
    progress_done()
    return history, tokens_seen, dropped


@dataclass(frozen=True)
class Policy:
    """What a forward pass needs: the model being trained, its head in float32, the
    tokens packed into one forward at most, the device."""

    model: Any
    head: Head
    limit: int
    device: Any


def _machine(s: TrainSettings) -> tuple[Any, Any, Ranks]:
    """The process set up for the run (priority, threads, seed) and where it trains:
    the device, the dtype, this rank among the ranks."""
    if s.nice:  # before torch starts its threads, which inherit it
        os.nice(s.nice)
    if s.threads:
        torch.set_num_threads(s.threads)
    torch.manual_seed(s.seed)
    device, dtype = _device(s)
    ranks = Ranks.from_env(device)
    if ranks.many and device.type == "cuda":
        device = torch.device("cuda", ranks.local_rank)
        torch.cuda.set_device(device)
    return device, dtype, ranks


def _groups(snapshot: Path, s: TrainSettings, echo) -> tuple[list[Group], Notes]:
    """The snapshot's groups to train on, in a fixed order; what was left out, said."""
    groups, notes = load(snapshot, s)
    for line in notes.lines:
        echo(line)
    if not groups:
        raise NothingToTrain(
            f"nothing to train on in {snapshot}: {notes.equal_groups} groups with equal "
            f"scores, {notes.zero_advantage} members at their group's mean, "
            f"{notes.unusable} without token ids, {notes.too_long} too long"
        )
    groups.sort(key=lambda g: g.id)  # a fixed order for a given snapshot
    return groups, notes


def _optimizer(model, params: list, s: TrainSettings, parent: Path | None, echo):
    """AdamW at the run's learning rate, its moments the parent's where kept."""
    rate = s.rate_for(model.config.hidden_size)
    if s.learning_rate is None:
        echo(f"learning rate {rate:.2g}, fitted to the model's width {model.config.hidden_size}")
    optimizer = torch.optim.AdamW(params, lr=rate, weight_decay=0.0)
    if parent is not None and s.keep_optimizer_state:
        echo(_continue_optimizer(optimizer, Path(parent) / OPTIMIZER, rate))
    return optimizer


def _backward(
    policy: Policy,
    batch: list[Group],
    s: TrainSettings,
    ranks: Ranks,
    step_tokens: int,
    skipped: dict,
    gaps: dict[str, Gap],
    step: int,
    echo,
) -> tuple[dict, list[Group]]:
    """One step's gradient, accumulated over this rank's share of `batch` chunk by chunk;
    the step's totals and the groups trained (every rank's, so all decide alike). A
    group's first forward checks its gap; one the check skips is not backpropagated."""
    totals = {"loss": 0.0, "clipped": 0, "ratio": 0.0, "kl": 0.0}
    trained = []
    for group in ranks.share(batch):
        if group.id in skipped:
            continue
        for n, chunk in enumerate(chunks(group, policy.limit)):
            checking = n == 0 and group.id not in gaps  # its first forward
            parts, gap = _loss(policy.model, policy.head, chunk, s, policy.device, checking, step)
            if gap is not None:
                gaps[group.id] = gap
                if not _check(group, gap, s, skipped, echo):
                    break  # nothing of it backpropagated (the check is on chunk 0)
            (parts.loss / step_tokens).backward()
            totals["loss"] += parts.loss.item() / step_tokens
            totals["clipped"] += parts.clipped
            totals["ratio"] += parts.ratio_sum
            totals["kl"] += parts.kl_sum
        else:
            trained.append(group.id)
    if ranks.many:  # what every rank did this step, so all decide alike
        totals = ranks.sum(totals)
        for theirs in ranks.gather(skipped):
            skipped.update(theirs)
        done = {i for ids in ranks.gather(trained) for i in ids}
        trained = [g.id for g in batch if g.id in done]
    return totals, [g for g in batch if g.id in set(trained)]


def _dropped(epoch: int, batch: list[Group], loss: float, grad_norm: float, echo) -> Dropped:
    """A step whose loss or gradient is not finite: not applied, said, recorded."""
    echo(
        f"a step of epoch {epoch}: loss {loss}, gradient norm "
        f"{grad_norm}: not applied (groups {', '.join(g.id for g in batch)})"
    )
    return Dropped(epoch=epoch, groups=[g.id for g in batch], loss=loss, grad_norm=grad_norm)


def _record(
    step: int,
    epoch: int,
    totals: dict,
    grad_norm: float,
    lr: float,
    trained: list[Group],
    tokens: int,
    took_s: float,
) -> Step:
    """A step applied, as the manifest's history and the progress line show it."""
    rewards = [m.reward for g in trained for m in g.members]
    return Step(
        step=step,
        epoch=epoch,
        loss=totals["loss"],
        grad_norm=grad_norm,
        lr=lr,
        clip_fraction=totals["clipped"] / tokens,
        ratio_mean=totals["ratio"] / tokens,
        kl=totals["kl"] / tokens,
        reward_mean=sum(rewards) / len(rewards),
        tokens=tokens,
        tokens_per_s=tokens / took_s,
    )


def _write(
    out: Path,
    model,
    optimizer,
    s: TrainSettings,
    parent: Path | None,
    base_dir,
    snapshot: Path,
    groups: list[Group],
    skipped: dict,
    precision: Precision,
    metrics: Metrics,
    history: list[Step],
) -> Manifest:
    """The checkpoint: the adapter, the optimizer's moments and the manifest beside them."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    adapter.name_base(out, s.served_base)
    torch.save(optimizer.state_dict(), out / OPTIMIZER)
    config = s.model_dump_json()
    manifest = Manifest(
        name=out.name,
        parent=str(parent) if parent else None,
        base_model=str(base_dir),
        snapshot_sha256=hashlib.sha256(Path(snapshot).read_bytes()).hexdigest(),
        config_sha256=hashlib.sha256(config.encode()).hexdigest(),
        config=json.loads(config),
        groups=[g.id for g in groups],
        skipped_groups=skipped,
        precision=precision,
        metrics=metrics,
        history=history,
        created=time.time(),
    )
    manifest.write(out)
    return manifest


@dataclass(frozen=True)
class Gap:
    """How far the policy's logprobs were from the logged ones on a group's first forward:
    |logp - old| summed over its tokens, its max, and the optimizer steps taken before
    (at step 0 the same weights, so ~0 up to numerics and dtypes)."""

    sum: float
    max: float
    tokens: int
    step: int = 0

    @property
    def mean(self) -> float:
        return self.sum / max(self.tokens, 1)


def _gap(group: Group, model, head: Head, limit: int, device) -> Gap:
    """A group's gap on its first chunk, with no gradient (before a warm start)."""
    chunk = next(iter(chunks(group, limit)))
    with torch.no_grad():
        return _gap_of(sampled_logprobs(model, head, chunk, device), _old(chunk, device), 0)


def _gap_of(logp: torch.Tensor, old: torch.Tensor, step: int) -> Gap:
    gap = (logp.detach() - old).abs()
    return Gap(gap.sum().item(), gap.max().item() if gap.numel() else 0.0, gap.numel(), step)


def _check(group: Group, gap: Gap, s: TrainSettings, skipped: dict, echo) -> bool:
    """Whether the group may train: a policy that disagrees with the logged logprobs by more
    than `max_logprob_gap` per token was not the sampler (other weights, tokenizer or
    template), and its ratios would be noise. A group first seen after some steps also
    carries what those steps moved the policy (`Gap.step` says how many; the manifest's
    `logprob_gap_first_forward_max` shows it)."""
    if gap.mean <= s.max_logprob_gap:
        return True
    skipped[group.id] = (
        f"the policy's logprobs differ from the logged ones by {gap.mean:.3g} per token "
        f"(max {gap.max:.3g}) on its first forward, after {gap.step} steps: sampled by other "
        "weights, tokenizer or template"
    )
    echo(f"group {group.id}: {skipped[group.id]}, skipped")
    return False


def _with_checks(
    metrics: Metrics,
    gaps: dict[str, Gap],
    drift: tuple[Drift, Drift],
    skipped: int,
    dropped: list[Dropped],
    ranks: int,
    weight_gap: float,
) -> Metrics:
    """`_summary`'s metrics with the run's checks: the logprob gap at step 0 (the groups of
    the first step, checked before any update) and on every group's first forward; the
    drift from the base model on the snapshot's tokens and on the policy's own answers; the
    groups skipped, the steps dropped, and the ranks' agreement."""
    first = [g for g in gaps.values() if g.step == 0] or list(gaps.values())
    every = list(gaps.values())
    base, own = drift
    return msgspec.structs.replace(
        metrics,
        logprob_gap_step0=sum(g.sum for g in first) / max(sum(g.tokens for g in first), 1),
        logprob_gap_step0_max=max((g.max for g in first), default=0.0),
        logprob_gap_first_forward_max=max((g.max for g in every), default=0.0),
        kl_to_base=base.kl,
        kl_to_base_tokens=base.tokens,
        kl_to_base_own=own.kl,
        kl_to_base_own_tokens=own.tokens,
        skipped_groups=skipped,
        dropped_steps=dropped,
        ranks=ranks,
        ranks_weight_gap=weight_gap,
    )


def _warmup(steps: int) -> Callable[[int], float]:
    """The learning rate's factor at optimizer step k (0-based): (k + 1) / steps during a
    warm-up of `steps`, then 1. A fresh AdamW's first update moves every parameter by
    about the full rate whatever the gradient's size; rising to it spreads that over
    several steps' gradients."""
    return lambda k: min(1.0, (k + 1) / steps) if steps else 1.0


def _continue_optimizer(optimizer, path: Path, learning_rate: float) -> str:
    """Load the parent's AdamW moments into `optimizer` when they fit its parameters; the
    learning rate stays this run's. Says what it did."""
    if not path.exists():
        return f"optimizer: fresh AdamW (the parent has no {OPTIMIZER})"
    state = torch.load(path, map_location="cpu", weights_only=True)
    ours = optimizer.state_dict()
    shapes = [tuple(v["exp_avg"].shape) for _, v in sorted(state.get("state", {}).items())]
    params = [tuple(p.shape) for group in optimizer.param_groups for p in group["params"]]
    if len(state.get("param_groups", [])) != len(ours["param_groups"]) or shapes != params:
        return "optimizer: fresh AdamW (the parent's moments are for other parameters)"
    optimizer.load_state_dict(state)
    for group in optimizer.param_groups:
        group["lr"] = learning_rate
        # The parent's warm-up left its own rate here; the scheduler would take it as ours.
        group.pop("initial_lr", None)
    steps = max((float(v["step"]) for v in optimizer.state.values()), default=0)
    return f"optimizer: the parent's AdamW moments continued ({steps:.0f} steps behind them)"


KL_GROUPS = 2  # groups the KL-to-base estimate reads: enough for a guard, a bounded cost


@dataclass(frozen=True)
class Drift:
    """k3(policy ‖ base) per token, and the tokens it read."""

    kl: float
    tokens: int


def _kl_to_base(model, head: Head, groups: list[Group], limit: int, device) -> Drift:
    """The trained policy against the base model (the adapter off) on the sampled tokens of
    up to `KL_GROUPS` groups: k3 per token weighted by policy / sampler (the tokens are
    the sampler's, not the policy's: `maths.k3_of_sampled`), and the tokens read. A
    continued checkpoint measures its whole lineage's drift, which is what a guard must
    bound."""
    total, weights, tokens = 0.0, 0.0, 0
    with torch.no_grad():
        for group in groups[:KL_GROUPS]:
            for chunk in chunks(group, limit):
                logp = sampled_logprobs(model, head, chunk, device)
                with model.disable_adapter():
                    ref = sampled_logprobs(model, head, chunk, device)
                part, weight = k3_of_sampled(logp, ref, _old(chunk, device))
                total, weights, tokens = total + part, weights + weight, tokens + logp.numel()
    return Drift(total / weights if weights else 0.0, tokens)


# Tokens the policy samples per prompt for `kl_to_base_own`.
OWN_TOKENS = 32


def _kl_on_own_samples(model, head: Head, groups: list[Group], device) -> Drift:
    """k3(policy ‖ base) per token on answers the trained policy samples itself (one per
    group's prompt, `OWN_TOKENS` tokens, temperature 1): the estimator
    is unbiased only on the policy's own samples, and a candidate that learned a new
    way to answer (a hedge the old sampler never wrote) moved most there.

    The prompts are sampled together, left-padded (`generate` places each row's
    positions by its mask), and the policy's logprobs are the logits `generate` sampled
    from; the base scores every answer in one forward, right-padded (a causal model's
    pads after a row change nothing before them), its head on the answers' rows only.
    One prompt at a time, decoding and scoring with the policy again cost 4 prompts
    ~11 s of a 16-group run's ~57 CPU s (docs/benchmarks.md, "A training run's
    overhead")."""
    prompts = [g.members[0].tokens[: g.members[0].first_loss] for g in groups]
    if not prompts:
        return Drift(0.0, 0)
    pad = _pad_id(model.config)
    pad = 0 if pad is None else pad
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=OWN_TOKENS,
            pad_token_id=pad,
            output_logits=True,
            return_dict_in_generate=True,
        )
        answers = [_until_end(row.tolist(), model.config) for row in out.sequences[:, width:]]
        sampled = torch.stack(out.logits, 1).float().log_softmax(-1)  # [rows, steps, vocab]
        rows = [p + a for p, a in zip(prompts, answers, strict=True)]
        longest = max(len(r) for r in rows)
        batch = torch.tensor([r + [pad] * (longest - len(r)) for r in rows], device=device)
        with model.disable_adapter():
            hidden = decoder_of(model)(input_ids=batch, use_cache=False).last_hidden_state
            total, tokens = 0.0, 0
            for i, (p, a) in enumerate(zip(prompts, answers, strict=True)):
                if not a:
                    continue
                target = torch.tensor(a, device=device)
                logp = sampled[i, : len(a)].gather(-1, target[:, None]).squeeze(-1)
                ref = token_logprobs(hidden[i, len(p) - 1 : len(p) + len(a) - 1], head, target)
                total += k3(logp, ref).sum().item()
                tokens += len(a)
    return Drift(total / max(tokens, 1), tokens)


def _until_end(tokens: list[int], config) -> list[int]:
    """A sampled row up to and including its first end-of-sequence id (`generate` pads a
    finished row with one)."""
    ends = _eos_ids(config)
    for n, t in enumerate(tokens):
        if t in ends:
            return tokens[: n + 1]
    return tokens


def _quiet(_: str) -> None:
    pass


def _eos_ids(config) -> list:
    """The end-of-sequence ids: a family may list several; any of them ends a row."""
    eos = config.eos_token_id
    return list(eos) if isinstance(eos, list | tuple) else [eos]


def _pad_id(config) -> int | None:
    """`generate` pads finished rows with this: the first end-of-sequence id."""
    return next(iter(_eos_ids(config)), None)


@dataclass(frozen=True)
class WarmStart:
    """What the warm start did, for its progress line: the members it fitted, its first
    and last step's loss."""

    members: int
    loss_first: float
    loss_last: float


def _warm_start(
    model, head: Head, groups: list[Group], s: TrainSettings, device, ranks: Ranks
) -> WarmStart:
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
            for m in ranks.share(batch):
                loss = -sampled_logprobs(model, head, [m], device).sum() / tokens
                loss.backward()
                total += loss.item()
            total = ranks.sum({"loss": total})["loss"]
            ranks.sum_gradients(params)
            torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(total)
    return WarmStart(len(best), losses[0], losses[-1])


def _loss(
    model,
    head: Head,
    members: list[Sequence],
    s: TrainSettings,
    device,
    check: bool = False,
    step: int = 0,
) -> tuple[LossParts, Gap | None]:
    """A chunk's loss and, when `check` (a group's first forward), its gap: measured only
    then, since each measure costs two device syncs."""
    adv = torch.tensor(
        [m.advantage for m in members for keep in m.loss_mask if keep], device=device
    )
    logp = sampled_logprobs(model, head, members, device)
    ref = None
    if s.kl_beta > 0:
        with torch.no_grad(), model.disable_adapter():
            ref = sampled_logprobs(model, head, members, device)
    old = _old(members, device)
    parts = policy_loss(
        logp,
        old,
        adv,
        eps_low=s.eps_low,
        eps_high=s.eps_high,
        dual_clip=s.dual_clip,
        kind=s.loss,
        cispo_max_weight=s.cispo_max_weight,
        ref_logp=ref,
        beta=s.kl_beta,
    )
    return parts, _gap_of(logp, old, step) if check else None


def _old(members: list[Sequence], device) -> torch.Tensor:
    """The sampler's logprob of every loss token, in `sampled_logprobs`' order."""
    return torch.tensor(
        [lp for m in members for lp, keep in zip(m.old_logprobs, m.loss_mask, strict=True) if keep],
        device=device,
        dtype=torch.float32,
    )


def _device(s: TrainSettings):
    cuda = torch.cuda.is_available() and s.device != "cpu"
    if s.device == "cuda" and not torch.cuda.is_available():
        raise NoDevice("trainer.device = cuda but no CUDA device is available")
    device = torch.device("cuda" if cuda else "cpu")
    if s.dtype == "auto":
        dtype = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float32
    else:
        dtype = getattr(torch, s.dtype)
    return device, dtype


def _summary(history: list[Step], groups, notes, duration: float, tokens: int) -> Metrics:
    """The run's metrics but its checks' (the gaps, the KL to base, the ranks): `_train`
    adds those."""
    return Metrics(
        steps=len(history),
        groups=len(groups),
        members=sum(len(g.members) for g in groups),
        skipped_equal_groups=notes.equal_groups,
        skipped_too_long=notes.too_long,
        turns_trained_in_their_turn_group=notes.trained_elsewhere,
        members_outside_baseline=notes.outside_baseline,
        loss_first=history[0].loss,
        loss_last=history[-1].loss,
        reward_mean=sum(h.reward_mean for h in history) / len(history),
        clip_fraction=sum(h.clip_fraction for h in history) / len(history),
        kl=sum(h.kl for h in history) / len(history),
        tokens=tokens,
        tokens_per_s=tokens / duration,
        duration_s=duration,
    )


def _progress(total: int, enabled: bool, echo):
    """A bar on a terminal; in a log (the training child of `onjob serve`) a line per step."""
    if not enabled:
        return (lambda record: None), (lambda: None)
    if not sys.stderr.isatty():

        def line(r: Step) -> None:
            echo(
                f"step {r.step}/{total}: loss {r.loss:.4f}, reward {r.reward_mean:.2f}, "
                f"{r.tokens_per_s:.0f} tokens/s"
            )

        return line, (lambda: None)
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc="grpo", unit="step")

    def update(r: Step) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{r.loss:.4f}", reward=f"{r.reward_mean:.2f}")

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
