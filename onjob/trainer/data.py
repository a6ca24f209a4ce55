"""From a snapshot to training sequences: tokens, which of them the loss sees, the sampler's
logprobs, and each member's group-relative advantage.

The engine's logged token ids are used as they are (no re-tokenizing, so the
importance ratio compares like with like). The loss sees only tokens the policy
sampled: a conversation's sequence is its last prompt plus its last answer, and
each earlier answer is found at the place its turn's prompt ends; prompts, tool
results and user turns stay masked. An earlier answer the chat template rendered
differently on the next turn cannot be found and is masked (counted in the notes).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from .maths import advantages
from .settings import TrainSettings


@dataclass
class Sequence:
    member_id: str
    tokens: list[int]
    loss_mask: list[bool]  # per token: True where the policy sampled it
    old_logprobs: list[float]  # per token: the sampler's logprob (0 where masked)
    advantage: float
    reward: float

    @property
    def first_loss(self) -> int:
        return self.loss_mask.index(True)

    @property
    def loss_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class Group:
    id: str
    kind: str
    members: list[Sequence] = field(default_factory=list)

    @property
    def loss_tokens(self) -> int:
        return sum(m.loss_tokens for m in self.members)


@dataclass
class Notes:
    """What was skipped and why: said out loud, never a silent no-op."""

    lines: list[str] = field(default_factory=list)
    equal_groups: int = 0
    zero_advantage: int = 0
    unusable: int = 0
    unaligned_turns: int = 0


def sequence(prompts, completions, logprobs) -> tuple[list[int], list[bool], list[float], int]:
    """One member's tokens, loss mask and old logprobs; and how many turns could not be
    placed in the final sequence."""
    tokens = list(prompts[-1]) + list(completions[-1])
    mask = [False] * len(tokens)
    old = [0.0] * len(tokens)
    unaligned = 0
    for prompt, completion, lps in zip(prompts, completions, logprobs, strict=True):
        start, end = len(prompt), len(prompt) + len(completion)
        if tokens[:start] != list(prompt) or tokens[start:end] != list(completion):
            unaligned += 1
            continue
        mask[start:end] = [True] * len(completion)
        old[start:end] = list(lps)
    return tokens, mask, old, unaligned


def load(path: Path, s: TrainSettings) -> tuple[list[Group], Notes]:
    rows = pq.read_table(path).to_pylist()
    by_group: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_group[row["group_id"]].append(row)
    groups, notes = [], Notes()
    for group_id, members in by_group.items():
        rewards = [m["reward"] for m in members]
        if max(rewards) - min(rewards) <= s.min_spread:
            notes.equal_groups += 1
            notes.lines.append(
                f"group {group_id}: all {len(members)} members scored {rewards[0]:.2f}: "
                "nothing to learn, skipped"
            )
            continue
        group = Group(group_id, members[0]["kind"])
        for m, adv in zip(members, advantages(rewards, normalize_std=s.normalize_std), strict=True):
            if abs(adv) < 1e-9:
                notes.zero_advantage += 1
                continue
            if not _usable(m):
                notes.unusable += 1
                notes.lines.append(
                    f"member {m['member_id']}: no token ids or logprobs logged, skipped"
                )
                continue
            tokens, mask, old, unaligned = sequence(
                m["prompt_ids"], m["completion_ids"], m["logprobs"]
            )
            notes.unaligned_turns += unaligned
            if any(mask):
                group.members.append(Sequence(m["member_id"], tokens, mask, old, adv, m["reward"]))
        if group.members:
            groups.append(group)
    if notes.zero_advantage:
        notes.lines.append(f"{notes.zero_advantage} members at their group's mean: no gradient")
    if notes.unaligned_turns:
        notes.lines.append(
            f"{notes.unaligned_turns} earlier turns not found in their conversation's final "
            "tokens (the chat template re-rendered them): masked"
        )
    return groups, notes


def _usable(m: dict) -> bool:
    turns = zip(m["prompt_ids"] or [], m["completion_ids"] or [], m["logprobs"] or [], strict=False)
    return bool(m["prompt_ids"]) and all(
        p and c and lp is not None and len(c) == len(lp) for p, c, lp in turns
    )
