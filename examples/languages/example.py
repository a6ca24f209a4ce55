"""examples/languages as `onjob demo --example languages` runs it."""

from __future__ import annotations

from examples.single_turn import example

from . import task

EXAMPLE = example(
    "languages",
    task,
    "examples/languages: a country's language, reward = 1 said plainly, 0.5 amid rambling",
    # 240 answers took 55 s on an engine measured at 56-58 tokens/s.
    sample_tokens=14,
)
