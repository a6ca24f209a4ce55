"""examples/capitals as `onjob demo --example capitals` runs it."""

from __future__ import annotations

from examples.single_turn import example

from . import task

EXAMPLE = example(
    "capitals",
    task,
    "examples/capitals: countries' capitals named alone, reward = the referee's 1 or 0",
    # 240 answers took 66 s on an engine measured at 56-78 tokens/s.
    sample_tokens=18,
)
