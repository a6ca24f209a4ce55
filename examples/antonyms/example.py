"""examples/antonyms as `onjob demo --example antonyms` runs it."""

from __future__ import annotations

from examples.single_turn import example

from . import task

EXAMPLE = example(
    "antonyms",
    task,
    "examples/antonyms: one-word opposites, reward = 1 the opposite alone, 0.5 among others",
    # 240 answers took 50 s on an engine measured at 51-62 tokens/s.
    sample_tokens=12,
)
