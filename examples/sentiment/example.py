"""examples/sentiment as `onjob demo --example sentiment` runs it."""

from __future__ import annotations

from examples.single_turn import example

from . import task

EXAMPLE = example(
    "sentiment",
    task,
    "examples/sentiment: made-up reviews' sentiment, reward = 1 the label alone, 0.5 among "
    "other words",
    # 240 answers took 37 s on an engine measured at 37-44 tokens/s.
    sample_tokens=7,
)
