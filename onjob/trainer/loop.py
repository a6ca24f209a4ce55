"""One GRPO training run: snapshot in, LoRA checkpoint out. Reads top to bottom.

    groups  = the snapshot's groups: advantages, masks, the sampler's logprobs (data.py)
    model   = base + LoRA (new, or the live adapter continued), no dropout
    optimizer = AdamW, its moments continued from the parent's `optimizer.pt` if any;
                the learning rate warmed up linearly over `warmup_steps` (setup.py)
    check   = every group's logprobs under the weights that sampled it against the
              logged ones, once before any update: a group they disagree on was sampled
              by other weights, tokenizer or template, skipped and named (check.py)
    warm start, if asked: supervised passes on each group's best member (warm.py)
    region  = the trust region: a KL budget to the base model and to the run's start,
              held on the policy's own answers, the sampler's tokens as a screen
              (trust.py)
    for each step of `groups_per_step` groups (`grpo_step`):
        for each group, members chunked by length (forward.chunks):
            one packed forward: the shared prompt once, each member's own tokens
            logprobs of the sampled tokens (fp32 head, no full-vocabulary log-softmax kept)
            loss = clipped ratio x advantage, summed / the step's tokens; backward (maths.py)
        clip, step (a step whose gradient is not finite is dropped, its groups recorded)
        the region keeps the step, or undoes it and halves the learning rate, or stops
    at the end: the own answers of the weights to write within the budget (stepping back
        to earlier kept weights if not); kl_to_base_own is what the release's KL guard
        reads, kl_to_base the same on the sampler's tokens
    save adapter (PEFT format) + optimizer.pt + onjob-manifest.json (checkpoint.py)

Runs as `onjob train --snapshot S --out DIR` in a child process of the server, or as a
job of its own on another host; under `torchrun --nproc-per-node N` each rank computes
its share of every step's groups and the gradients are summed before the step
(`ranks.py`: data parallel, the weights equal on every rank), and rank 0 writes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from . import adapter, check, checkpoint, setup, trust
from .data import Group, Sequence
from .errors import Diverged, NothingToTrain, OverBudget
from .foreign import translated
from .forward import Head, Policy, chunks, pack_limit, sampled_logprobs, sampler_logprobs
from .manifest import Dropped, Manifest, Step
from .maths import LossParts, policy_loss
from .ranks import Ranks
from .report import Report
from .settings import TrainSettings
from .warm import warm_start


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
    device, dtype, ranks = setup.machine(s)
    if not ranks.main:
        echo = _quiet  # one rank speaks for the run

    # --- data (every rank reads the whole snapshot; each computes its share of a step)
    groups, notes = setup.groups(snapshot, s, echo)

    # --- model and optimizer (a lineage's moments carry on)
    model, base_dir = adapter.load(s, parent, device, dtype)
    head = Head.of(model.get_base_model())
    policy = Policy(model, head, pack_limit(model, s.max_batch_tokens), device)
    precision = setup.precision(model, head, device, dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    ranks.same_start(params)
    optimizer = setup.optimizer(model, params, s, parent, echo)
    steps = math.ceil(len(groups) / s.groups_per_step) * s.epochs
    echo(
        f"training on {len(groups)} groups, {sum(len(g.members) for g in groups)} members, "
        f"{sum(g.loss_tokens for g in groups)} tokens: {steps} steps on {device} ({dtype})"
        + (f", {ranks.world} ranks" if ranks.many else "")
    )

    # --- before the first update: the sampler check, then the warm start (it moves the policy)
    checked = check.samplers(policy, groups, notes, s, parent, echo)
    trained = checked.kept(groups)
    if not trained:
        raise NothingToTrain(f"nothing to train on in {snapshot}: every group was skipped")
    if s.sft_epochs:
        echo(warm_start(policy, trained, s, ranks).said(s.sft_epochs))
    region = trust.Region.open(model, head, trained, policy.limit, device, params, optimizer,
                               s.kl_budget, s.kl_own_prompts)  # fmt: skip
    if s.kl_budget is not None:
        own = f"the policy's own answers to {len(region.prompts)} prompts, screened by "
        echo(f"trust region: {s.kl_budget:g} nats per token to the base model and to the "
             f"run's start, on {own if region.prompts else ''}the sampler's tokens of "
             f"{len(region.probe)} groups")  # fmt: skip
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: setup.warmup(s.warmup_steps)(k) * region.scale
    )

    # --- the steps, each kept or undone by the trust region
    report = Report(steps, s, show=progress, main=ranks.main, echo=echo)
    history: list[Step] = []
    dropped: list[Dropped] = []
    for epoch, batch in _batches(trained, s):
        stepped = grpo_step(policy, batch, s, ranks, params, optimizer)
        if not stepped.applied:  # recorded, and the run goes on with the other steps
            dropped.append(stepped.dropped(epoch, batch, echo))
            continue
        verdict = region.after_step(len(history) + 1, echo)
        schedule.step()  # after the verdict: a back-off halves the next step's rate
        history.append(stepped.record(len(history) + 1, epoch, batch, region, verdict))
        report.step(history[-1])
        if verdict == "stopped":
            break
    report.close()
    weight_gap = ranks.largest_difference(params)
    if not ranks.main:
        ranks.close()
        return None
    if not history:
        raise Diverged(
            f"all {len(dropped)} steps had a loss or gradient that is not finite; no checkpoint "
            "written (lower trainer.learning_rate?)"
        )

    # --- the checkpoint: the figures the release's KL guard reads, for the weights written
    probe, own, at = region.settle(echo)
    history = checkpoint.undone_after(history, at)
    if all(h.undone for h in history):
        raise OverBudget(
            f"no step of the run stayed within its KL budget {s.kl_budget:g}: nothing written "
            "(lower trainer.learning_rate, or raise trainer.kl_budget)"
        )
    run = checkpoint.Run(trained, notes, checked, history, dropped, region, probe, own,
                         ranks.world, weight_gap, time.perf_counter() - started)  # fmt: skip
    manifest = checkpoint.write(out, model, optimizer, s, parent, base_dir, snapshot, run,
                                precision)  # fmt: skip
    report.finish()
    ranks.close()
    m = manifest.metrics
    echo(
        f"wrote {out}: {m.steps} steps, loss {m.loss_last:.4f}, "
        f"{m.tokens_per_s:.0f} tokens/s, {m.duration_s:.1f} s"
    )
    return manifest


def _batches(groups: list[Group], s: TrainSettings) -> list[tuple[int, list[Group]]]:
    """Each step's groups, `groups_per_step` at a time, every epoch, with its epoch."""
    return [
        (epoch, groups[first : first + s.groups_per_step])
        for epoch in range(s.epochs)
        for first in range(0, len(groups), s.groups_per_step)
    ]


@dataclass
class Totals:
    """A step's figures, summed over its chunks (and ranks): its loss (already divided by
    the step's tokens), the tokens whose ratio was clipped, the sums of the ratios and of
    the KL to the base model over its tokens."""

    loss: float = 0.0
    clipped: float = 0.0
    ratio: float = 0.0
    kl: float = 0.0

    def add(self, parts: LossParts, tokens: int) -> None:
        self.loss += parts.loss.item() / tokens
        self.clipped += parts.clipped
        self.ratio += parts.ratio_sum
        self.kl += parts.kl_sum


@dataclass(frozen=True)
class Stepped:
    """A step taken: its totals, the gradient's norm before clipping, the learning rate,
    its tokens and time, and whether it was applied (not: its loss or gradient is not
    finite)."""

    totals: Totals
    grad_norm: float
    lr: float
    tokens: int
    took_s: float
    applied: bool

    def dropped(self, epoch: int, batch: list[Group], echo) -> Dropped:
        """A step not applied: said, and recorded."""
        echo(
            f"a step of epoch {epoch}: loss {self.totals.loss}, gradient norm "
            f"{self.grad_norm}: not applied (groups {', '.join(g.id for g in batch)})"
        )
        return Dropped(epoch=epoch, groups=[g.id for g in batch], loss=self.totals.loss,
                       grad_norm=self.grad_norm)  # fmt: skip

    def record(self, step: int, epoch: int, batch: list[Group], region: trust.Region,
               verdict: trust.Verdict) -> Step:  # fmt: skip
        """The step as the manifest's history and the progress line show it: with the
        trust region's reading after it, and whether it was undone."""
        rewards = [m.reward for g in batch for m in g.members]
        reading = region.latest
        return Step(
            step=step,
            epoch=epoch,
            loss=self.totals.loss,
            grad_norm=self.grad_norm,
            lr=self.lr,
            clip_fraction=self.totals.clipped / self.tokens,
            ratio_mean=self.totals.ratio / self.tokens,
            kl=self.totals.kl / self.tokens,
            reward_mean=sum(rewards) / len(rewards),
            tokens=self.tokens,
            tokens_per_s=self.tokens / self.took_s,
            kl_to_base=reading.to_base.kl if reading else None,
            kl_to_start=reading.to_start.kl if reading else None,
            kl_on=reading.on if reading else None,
            undone=True if verdict != "kept" else None,
        )


def grpo_step(
    policy: Policy,
    batch: list[Group],
    s: TrainSettings,
    ranks: Ranks,
    params: list[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
) -> Stepped:
    """One optimizer step on `batch`: the gradient accumulated over this rank's share chunk
    by chunk (each chunk's loss divided by the step's tokens), summed over the ranks,
    clipped, applied; a loss or gradient that is not finite is not applied."""
    started = time.perf_counter()
    tokens = sum(g.loss_tokens for g in batch)
    totals = Totals()
    for group in ranks.share(batch):
        for chunk in chunks(group, policy.limit):
            parts = chunk_loss(policy, chunk, s)
            (parts.loss / tokens).backward()
            totals.add(parts, tokens)
    if ranks.many:
        totals = Totals(**ranks.sum(asdict(totals)))
    ranks.sum_gradients(params)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm).item()
    lr = optimizer.param_groups[0]["lr"]
    applied = math.isfinite(totals.loss) and math.isfinite(grad_norm)
    if applied:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return Stepped(totals, grad_norm, lr, tokens, time.perf_counter() - started, applied)


def chunk_loss(policy: Policy, members: list[Sequence], s: TrainSettings) -> LossParts:
    """A chunk's loss: its members' logprobs now against the sampler's, weighted by their
    advantages (maths.policy_loss), with k3 to the base model when `kl_beta` > 0."""
    model, device = policy.model, policy.device
    adv = torch.tensor(
        [m.advantage for m in members for keep in m.loss_mask if keep], device=device
    )
    logp = sampled_logprobs(model, policy.head, members, device)
    ref = None
    if s.kl_beta > 0:
        with torch.no_grad(), model.disable_adapter():
            ref = sampled_logprobs(model, policy.head, members, device)
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


def _quiet(_: str) -> None:
    pass
