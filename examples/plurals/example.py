"""examples/plurals as `onjob demo --example plurals` runs it."""

from __future__ import annotations

from examples.single_turn import example

from . import task

EXAMPLE = example(
    "plurals",
    task,
    "examples/plurals: nouns' plurals said plainly, reward = 1 said plainly, 0.5 among others",
    # 240 answers took 70 s on an engine measured at 57-61 tokens/s.
    sample_tokens=17,
)
