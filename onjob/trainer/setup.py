"""What a run sets up before its first step: the process and its device, the snapshot's
groups in a fixed order, how the run computes, and AdamW (a lineage's moments continued,
the learning rate warmed up)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .data import Group, Notes, load
from .errors import NoDevice, NothingToTrain
from .forward import Head
from .manifest import Precision
from .ranks import Ranks
from .settings import TrainSettings

OPTIMIZER = "optimizer.pt"  # AdamW's state beside the adapter: the next run of the lineage


def machine(s: TrainSettings) -> tuple[Any, Any, Ranks]:
    """The process set up for the run (priority, threads, seed) and where it trains:
    the device, the dtype, this rank among the ranks."""
    if s.nice:  # before torch starts its threads, which inherit it
        os.nice(s.nice)
    if s.idle and hasattr(os, "SCHED_IDLE"):  # Linux; inherited by the threads too
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    if s.threads:
        torch.set_num_threads(s.threads)
    torch.manual_seed(s.seed)
    device, dtype = _device(s)
    ranks = Ranks.from_env(device)
    if ranks.many and device.type == "cuda":
        device = torch.device("cuda", ranks.local_rank)
        torch.cuda.set_device(device)
    return device, dtype, ranks


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


def groups(snapshot: Path, s: TrainSettings, echo) -> tuple[list[Group], Notes]:
    """The snapshot's groups to train on, in a fixed order; what was left out, said."""
    loaded, notes = load(snapshot, s)
    for line in notes.lines:
        echo(line)
    if not loaded:
        raise NothingToTrain(
            f"nothing to train on in {snapshot}: {notes.equal_groups} groups with equal "
            f"scores, {notes.zero_advantage} members at their group's mean, "
            f"{notes.unusable} without token ids, {notes.too_long} too long"
        )
    loaded.sort(key=lambda g: g.id)  # a fixed order for a given snapshot
    return loaded, notes


def precision(model, head: Head, device, dtype) -> Precision:
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


def optimizer(model, params: list, s: TrainSettings, parent: Path | None, echo):
    """AdamW at the run's learning rate, its moments the parent's where kept (a fresh
    AdamW's first steps move every parameter by about the learning rate, in the sign of
    a gradient of a few groups)."""
    rate = s.rate_for(model.config.hidden_size)
    if s.learning_rate is None:
        echo(f"learning rate {rate:.2g}, fitted to the model's width {model.config.hidden_size}")
    adamw = torch.optim.AdamW(params, lr=rate, weight_decay=0.0)
    if parent is not None and s.keep_optimizer_state:
        echo(_continue(adamw, Path(parent) / OPTIMIZER, rate))
    return adamw


def warmup(steps: int) -> Callable[[int], float]:
    """The learning rate's factor at optimizer step k (0-based): (k + 1) / steps during a
    warm-up of `steps`, then 1. A fresh AdamW's first update moves every parameter by
    about the full rate whatever the gradient's size; rising to it spreads that over
    several steps' gradients."""
    return lambda k: min(1.0, (k + 1) / steps) if steps else 1.0


def _continue(adamw, path: Path, learning_rate: float) -> str:
    """Load the parent's AdamW moments into `adamw` when they fit its parameters; the
    learning rate stays this run's. Says what it did."""
    if not path.exists():
        return f"optimizer: fresh AdamW (the parent has no {OPTIMIZER})"
    state = torch.load(path, map_location="cpu", weights_only=True)
    ours = adamw.state_dict()
    shapes = [tuple(v["exp_avg"].shape) for _, v in sorted(state.get("state", {}).items())]
    params = [tuple(p.shape) for group in adamw.param_groups for p in group["params"]]
    if len(state.get("param_groups", [])) != len(ours["param_groups"]) or shapes != params:
        return "optimizer: fresh AdamW (the parent's moments are for other parameters)"
    adamw.load_state_dict(state)
    for group in adamw.param_groups:
        group["lr"] = learning_rate
        # The parent's warm-up left its own rate here; the scheduler would take it as ours.
        group.pop("initial_lr", None)
    steps = max((float(v["step"]) for v in adamw.state.values()), default=0)
    return f"optimizer: the parent's AdamW moments continued ({steps:.0f} steps behind them)"
