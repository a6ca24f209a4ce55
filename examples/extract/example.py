"""examples/extract as `onjob demo --example extract` runs it."""

from __future__ import annotations

from examples.single_turn import example

from . import task

EXAMPLE = example(
    "extract",
    task,
    "examples/extract: one field of a made-up message, reward = 1 the field alone, 0.5 "
    "among other words",
    # 240 answers took 57 s on an engine measured at 38-39 tokens/s (on this task's longer
    # prompt, answers that stop early).
    sample_tokens=10,
)
