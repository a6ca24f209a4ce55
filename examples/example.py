"""What `onjob demo` needs of an example: its agent's traffic, its held-out measure, its
reward and referee. No settings of its own: the loop fits them to the traffic."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    name: str
    task: str  # one line for result.json
    reward: str  # `module:function`, the judge's reward
    referee: str  # `module:function`, the promotion gate's check
    questions: Callable[[int], list[str]]  # the agent's next questions (by a seed)
    converse: Callable[[object, str], None]  # one conversation through an openai client
    evaluate: Callable[[str, str, int, int], dict]  # (base_url, model, questions, samples)
    first_messages: Callable[[str], list[dict]]  # a question's opening (the speed probe)
    heldout: Callable[[int], list[str]]
    # What one held-out sample costs the engine, in tokens decoded at its measured speed
    # (every turn, the prompts' prefill included): the demo sizes its evaluations by it.
    sample_tokens: int = 25
    table: Callable[[dict, dict], list[str]] = lambda before, after: []
