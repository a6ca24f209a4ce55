"""One GRPO training run: snapshot in, LoRA checkpoint out. Reads top to bottom.

    groups  = data.load(snapshot)              advantages, masks, the sampler's logprobs
    model   = base + LoRA (new, or the live adapter continued), no dropout
    optimizer = AdamW, its moments continued from the parent's `optimizer.pt` if any;
                the learning rate warmed up linearly over `warmup_steps`
    check   = every group's logprobs under the starting policy against the logged ones,
              one forward each before any update: a group they disagree on was sampled
              by other weights, tokenizer or template, and is skipped and recorded
    region  = the trust region (trust.py): a KL budget to the base model and to the
              run's start, read on the policy's own answers (the sampler's tokens first,
              as a screen)
    for each step of `groups_per_step` groups:
        for each group, members chunked by length (forward.chunks):
            one packed forward: the shared prompt once, each member's own tokens
            logprobs of the sampled tokens (fp32 head, no full-vocabulary log-softmax kept)
            loss = clipped ratio x advantage, summed / the step's tokens; backward
        clip, step (a step whose gradient is not finite is dropped, its groups recorded)
        the region keeps the step, or undoes it and halves the learning rate, or stops
    kl_to_base_own = k3(policy ‖ base) per token on answers the trained policy samples
              itself from the groups' prompts: how far the checkpoint (its whole
              lineage) moved from the base model where it now goes, for the guard
              `loop.max_kl_to_base` (past the budget, the run steps back to earlier
              kept weights)
    kl_to_base = the same on the probe's tokens, each weighted by policy / sampler: where
              the old sampler went (shown beside it; the guard's figure without own
              answers)
    save adapter (PEFT format) + optimizer.pt + onjob-manifest.json

Runs as `onjob train --snapshot S --out DIR` in a child process of the server, or as a
job of its own on another host; under `torchrun --nproc-per-node N` each rank computes
its share of every step's groups and the gradients are summed before the step
(`ranks.py`: data parallel, the weights equal on every rank), and rank 0 writes.
"""

from __future__ import annotations

import contextlib
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
from msgspec import UNSET

from . import adapter, trust
from .data import Group, Notes, Sequence, load
from .errors import Diverged, NoDevice, NothingToTrain, OverBudget
from .foreign import translated
from .forward import Head, chunks, pack_limit, sampled_logprobs, sampler_logprobs
from .manifest import Dropped, Manifest, Metrics, Precision, Step
from .maths import LossParts, policy_loss
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
    echo(
        f"training on {len(groups)} groups, {sum(len(g.members) for g in groups)} members, "
        f"{sum(g.loss_tokens for g in groups)} tokens: {steps} steps on {device} ({dtype})"
        + (f", {ranks.world} ranks" if ranks.many else "")
    )
    skipped, gaps = _before_steps(policy, groups, notes, s, ranks, parent, echo)
    trained = [g for g in groups if g.id not in skipped]
    if not trained:
        raise NothingToTrain(f"nothing to train on in {snapshot}: every group was skipped")
    region = trust.Region.open(model, head, trained, policy.limit, device, params, optimizer,
                               s.kl_budget, s.kl_own_prompts)  # fmt: skip
    if s.kl_budget is not None:
        own = f"the policy's own answers to {len(region.prompts)} prompts, screened by "
        echo(f"trust region: {s.kl_budget:g} nats per token to the base model and to the "
             f"run's start, on {own if region.prompts else ''}the sampler's tokens of "
             f"{len(region.probe)} groups")  # fmt: skip
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: _warmup(s.warmup_steps)(k) * region.scale
    )
    wandb = _wandb(s) if ranks.main else None
    history, dropped = _steps(
        policy, trained, s, ranks, (params, optimizer, schedule), region,
        _progress(steps, progress and ranks.main, echo), wandb, echo,
    )  # fmt: skip
    weight_gap = ranks.largest_difference(params)
    if not ranks.main:
        ranks.close()
        return None
    if not history:
        raise Diverged(
            f"all {len(dropped)} steps had a loss or gradient that is not finite; no checkpoint "
            "written (lower trainer.learning_rate?)"
        )

    # --- checkpoint: the figures the release's KL guard reads, for the weights written
    reading, own, at = region.settle(echo)
    if at is not None:  # steps after the weights written: undone at the end
        history = [h if h.step <= at else msgspec.structs.replace(h, undone=True) for h in history]
    kept = [h for h in history if not h.undone]
    if not kept:
        raise OverBudget(
            f"no step of the run stayed within its KL budget {s.kl_budget:g}: nothing written "
            "(lower trainer.learning_rate, or raise trainer.kl_budget)"
        )
    duration = time.perf_counter() - started
    summary = _summary(kept, trained, notes, duration, sum(h.tokens or 0 for h in kept))
    metrics = _with_checks(summary, gaps, (reading, own), skipped, dropped, region, ranks.world,
                           weight_gap)  # fmt: skip
    manifest = _write(out, model, optimizer, s, parent, base_dir, snapshot, trained, skipped,
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
    policy: Policy,
    groups: list[Group],
    notes: Notes,
    s: TrainSettings,
    ranks: Ranks,
    parent: Path | None,
    echo,
) -> tuple[dict, dict[str, Gap]]:
    """The groups skipped and every group's gap, measured once before the first update:
    each member against the weights that sampled it (the run's start, or the checkpoint
    before it, `trainer.max_staleness`), one forward per group and sampler. Drift the
    run's own updates cause, and the lineage's since an earlier checkpoint sampled a
    group, is the importance ratio's job (CISPO's capped weights), not a reason to skip a
    group; only a real mismatch (other weights, tokenizer or template) is. With a warm
    start, which moves the policy, it runs after the check."""
    skipped = dict(notes.skipped)
    gaps = _gaps(policy, groups, parent, echo)
    for group in groups:
        _check(group, gaps[group.id], s, skipped, echo)
    if s.sft_epochs:
        kept = [g for g in groups if g.id not in skipped]
        sft = _warm_start(policy.model, policy.head, kept, s, policy.device, ranks)
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
    region: trust.Region,
    progress: tuple,
    wandb,
    echo,
) -> tuple[list[Step], list[Dropped]]:
    """The run's steps, `groups_per_step` groups each, every epoch, each kept or undone by
    the trust region, until it stops the run: the history of the steps applied (an
    undone one marked so) and the steps dropped."""
    params, optimizer, schedule = optimizing
    step_done, progress_done = progress
    history: list[Step] = []
    dropped: list[Dropped] = []
    batches = [
        (epoch, groups[first : first + s.groups_per_step])
        for epoch in range(s.epochs)
        for first in range(0, len(groups), s.groups_per_step)
    ]
    for epoch, batch in batches:
        step_tokens = sum(g.loss_tokens for g in batch)
        step_started = time.perf_counter()
        totals = _backward(policy, batch, s, ranks, step_tokens)
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
        verdict = region.after_step(len(history) + 1, echo)
        schedule.step()  # after the verdict: a back-off halves the next step's rate
        record = _record(len(history) + 1, epoch, totals, grad_norm, lr, batch, step_tokens,
                         time.perf_counter() - step_started, region, verdict)  # fmt: skip
        history.append(record)
        step_done(record)
        if wandb:
            wandb.log(msgspec.to_builtins(record))
        if verdict == "stopped":
            break
    progress_done()
    return history, dropped


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
    policy: Policy, batch: list[Group], s: TrainSettings, ranks: Ranks, step_tokens: int
) -> dict:
    """One step's gradient, accumulated over this rank's share of `batch` chunk by chunk;
    the step's totals, summed over the ranks."""
    totals = {"loss": 0.0, "clipped": 0, "ratio": 0.0, "kl": 0.0}
    for group in ranks.share(batch):
        for chunk in chunks(group, policy.limit):
            parts = _loss(policy.model, policy.head, chunk, s, policy.device)
            (parts.loss / step_tokens).backward()
            totals["loss"] += parts.loss.item() / step_tokens
            totals["clipped"] += parts.clipped
            totals["ratio"] += parts.ratio_sum
            totals["kl"] += parts.kl_sum
    return ranks.sum(totals) if ranks.many else totals


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
    region: trust.Region,
    verdict: trust.Verdict,
) -> Step:
    """A step applied, as the manifest's history and the progress line show it: with the
    trust region's reading after it, and whether it was undone."""
    rewards = [m.reward for g in trained for m in g.members]
    reading = region.latest
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
        kl_to_base=reading.to_base.kl if reading else None,
        kl_to_start=reading.to_start.kl if reading else None,
        kl_on=reading.on if reading else None,
        undone=True if verdict != "kept" else None,
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
    """How far the policy's logprobs were from the logged ones before the first update:
    |logp - old| summed over a group's first chunk, its max, and the tokens (the same
    weights as the sampler's, so ~0 up to numerics and dtypes)."""

    sum: float
    max: float
    tokens: int

    @property
    def mean(self) -> float:
        return self.sum / max(self.tokens, 1)


def _gaps(policy: Policy, groups: list[Group], parent: Path | None, echo) -> dict[str, Gap]:
    """Each group's gap, its members measured against their sampler's weights: the run's
    start (`parent`, None: the base model), the base model (the adapter off), or an
    earlier checkpoint of the lineage, loaded beside the policy from `parent`'s folder for
    the check and dropped after it. A sampler whose weights this run cannot find is
    measured against the run's start, and said."""
    start = parent.name if parent is not None else None
    by_sampler: dict[str | None, list[Group]] = {}
    for g in groups:
        members: dict[str | None, list[Sequence]] = {}
        for m in g.members:
            members.setdefault(m.sampler, []).append(m)
        for sampler, ms in members.items():
            by_sampler.setdefault(sampler, []).append(Group(g.id, g.kind, ms))
    parts: dict[str, list[Gap]] = {g.id: [] for g in groups}
    for sampler, subgroups in by_sampler.items():
        with _weights_of(policy.model, sampler, start, parent, echo):
            for sub in subgroups:
                parts[sub.id].append(
                    _gap(sub, policy.model, policy.head, policy.limit, policy.device)
                )
    return {
        gid: Gap(sum(p.sum for p in ps), max(p.max for p in ps), sum(p.tokens for p in ps))
        for gid, ps in parts.items()
    }


@contextlib.contextmanager
def _weights_of(model, sampler: str | None, start: str | None, parent: Path | None, echo):
    """The policy's forwards give `sampler`'s logprobs inside (see `_gaps`)."""
    if sampler == start:
        yield
        return
    if sampler is None:
        with model.disable_adapter():
            yield
        return
    path = parent.parent / sampler if parent is not None else None
    if path is None or not (path / "adapter_config.json").exists():
        where = f"beside the run's start ({parent})" if parent else "(the run starts at the base)"
        echo(
            f"groups sampled by {sampler}: its weights are not found {where}; their gap is "
            "measured against the start"
        )
        yield
        return
    model.load_adapter(str(path), adapter_name=_SAMPLER)
    adapter.without_dropout(model)
    model.set_adapter(_SAMPLER)
    try:
        yield
    finally:
        model.set_adapter("default")  # its parameters trainable again, the sampler's not
        model.delete_adapter(_SAMPLER)


_SAMPLER = "sampler"  # the adapter name an earlier checkpoint is loaded under for the check


def _gap(group: Group, model, head: Head, limit: int, device) -> Gap:
    """A group's gap on its first chunk, with no gradient."""
    chunk = next(iter(chunks(group, limit)))
    with torch.no_grad():
        gap = (sampled_logprobs(model, head, chunk, device) - sampler_logprobs(chunk, device)).abs()
    return Gap(gap.sum().item(), gap.max().item() if gap.numel() else 0.0, gap.numel())


def _check(group: Group, gap: Gap, s: TrainSettings, skipped: dict, echo) -> bool:
    """Whether the group may train: a starting policy that disagrees with the logged
    logprobs by more than `max_logprob_gap` per token was not the sampler (other weights,
    tokenizer or template), and its ratios would be noise."""
    if gap.mean <= s.max_logprob_gap:
        return True
    skipped[group.id] = (
        f"the policy's logprobs differ from the logged ones by {gap.mean:.3g} per token "
        f"(max {gap.max:.3g}) before the first update: sampled by other weights, tokenizer "
        "or template"
    )
    echo(f"group {group.id}: {skipped[group.id]}, skipped")
    return False


def _with_checks(
    metrics: Metrics,
    gaps: dict[str, Gap],
    drift: tuple[trust.Reading, trust.Reading | None],
    skipped: dict,
    dropped: list[Dropped],
    region: trust.Region,
    ranks: int,
    weight_gap: float,
) -> Metrics:
    """`_summary`'s metrics with the run's checks: the logprob gap before the first update;
    the drift from the base model (on the probe's tokens and on the policy's own answers)
    and from the run's start, the trust region's budget and what it undid; the groups
    skipped, the steps dropped, and the ranks' agreement."""
    every = list(gaps.values())
    gap = sum(g.sum for g in every) / max(sum(g.tokens for g in every), 1)
    gap_max = max((g.max for g in every), default=0.0)
    reading, own = drift
    return msgspec.structs.replace(
        metrics,
        logprob_gap_step0=gap,
        logprob_gap_step0_max=gap_max,
        logprob_gap_first_forward_max=gap_max,  # the same check since it moved before step 1
        kl_to_base=reading.to_base.kl,
        kl_to_base_tokens=reading.to_base.tokens,
        kl_to_base_own=own.to_base.kl if own else UNSET,
        kl_to_base_own_tokens=own.to_base.tokens if own else UNSET,
        skipped_groups=len(skipped),
        kl_budget=region.budget,
        kl_to_start=(own or reading).to_start.kl,
        undone_steps=region.backoffs,
        trust_stopped=region.stopped or UNSET,
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


def _quiet(_: str) -> None:
    pass


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
) -> LossParts:
    """A chunk's loss."""
    adv = torch.tensor(
        [m.advantage for m in members for keep in m.loss_mask if keep], device=device
    )
    logp = sampled_logprobs(model, head, members, device)
    ref = None
    if s.kl_beta > 0:
        with torch.no_grad(), model.disable_adapter():
            ref = sampled_logprobs(model, head, members, device)
    return policy_loss(
        logp,
        sampler_logprobs(members, device),
        adv,
        eps_low=s.eps_low,
        eps_high=s.eps_high,
        dual_clip=s.dual_clip,
        kind=s.loss,
        cispo_max_weight=s.cispo_max_weight,
        ref_logp=ref,
        beta=s.kl_beta,
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
