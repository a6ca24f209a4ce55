"""A run's progress as it goes: a bar on a terminal, a line per step in a log (the
training child of `onjob serve`), and Weights & Biases when `trainer.wandb_project` is
set."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import msgspec

from .manifest import Step
from .settings import TrainSettings


class Report:
    """Where each step applied is shown; `close` when the steps are done."""

    def __init__(
        self, total: int, s: TrainSettings, *, show: bool, main: bool, echo: Callable[[str], None]
    ) -> None:
        """`show`: progress shown; `main`: the rank that speaks for the run (W&B's)."""
        self._show, self._close = _progress(total, show and main, echo)
        self._wandb = _wandb(s) if main else None

    def step(self, record: Step) -> None:
        self._show(record)
        if self._wandb:
            self._wandb.log(msgspec.to_builtins(record))

    def close(self) -> None:
        self._close()

    def finish(self) -> None:
        """The run written: W&B's run ends."""
        if self._wandb:
            self._wandb.finish()


def _progress(total: int, enabled: bool, echo):
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
