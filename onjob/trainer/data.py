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

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from ..logprobs import TRAINED
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
    sampler: str | None = None  # the checkpoint that sampled it (None: the base model)

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
    """What was skipped and why: said out loud, never a silent no-op. `skipped` holds the
    groups this run consumes without training on them (recorded in the manifest, so they
    are not exported again)."""

    lines: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # group id -> why
    equal_groups: int = 0
    zero_advantage: int = 0
    unusable: int = 0
    too_long: int = 0
    unaligned_turns: int = 0
    trained_elsewhere: int = 0  # conversation turns masked: their own turn group trains them
    outside_baseline: int = 0  # members scored against their group's baseline, not in it


def sequence(
    prompts, completions, logprobs, keep: list[bool] | None = None
) -> tuple[list[int], list[bool], list[float], int]:
    """One member's tokens, loss mask and old logprobs; and how many turns could not be
    placed in the final sequence. A turn with `keep[i]` False stays as context, masked."""
    tokens = list(prompts[-1]) + list(completions[-1])
    mask = [False] * len(tokens)
    old = [0.0] * len(tokens)
    unaligned = 0
    for i, (prompt, completion, lps) in enumerate(zip(prompts, completions, logprobs, strict=True)):
        start, end = len(prompt), len(prompt) + len(completion)
        if tokens[:start] != list(prompt) or tokens[start:end] != list(completion):
            unaligned += 1
            continue
        if keep is not None and not keep[i]:
            continue
        mask[start:end] = [True] * len(completion)
        old[start:end] = list(lps)
    return tokens, mask, old, unaligned


def load(path: Path, s: TrainSettings) -> tuple[list[Group], Notes]:
    """The snapshot's groups as training sequences, and what was left out and why.

    One exchange is trained once: a conversation's turn that is also the logged member of
    a turn group in this snapshot stays in the conversation as context only (its turn
    group compares it with rivals for the same prompt, the better baseline)."""
    rows = pq.read_table(path).to_pylist()
    by_group: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_group[row["group_id"]].append(row)
    in_turn_groups = {
        (row["exchange_ids"][0], row["choice"])
        for row in rows
        if row["kind"] == "turn" and row.get("exchange_ids")
    }
    groups, notes = [], Notes()
    for group_id, members in by_group.items():
        if other := _other_definitions(members):
            _skip(
                notes,
                group_id,
                f"logprobs recorded as {', '.join(other)}; the importance ratio needs "
                f"{TRAINED} (start vLLM with --logprobs-mode {TRAINED} and set "
                f"proxy.engine_logprobs to match)",
            )
            continue
        rewards = [m["reward"] for m in members]
        if max(rewards) - min(rewards) <= s.min_spread:
            notes.equal_groups += 1
            _skip(
                notes,
                group_id,
                f"all {len(members)} members scored {rewards[0]:.2f}: nothing to learn",
            )
            continue
        baseline = _baseline(members)
        notes.outside_baseline += baseline.count(False)
        group = Group(group_id, members[0]["kind"])
        advs = advantages(
            rewards, normalize_std=s.normalize_std, std_floor=s.std_floor, baseline=baseline
        )
        for m, adv in zip(members, advs, strict=True):
            if abs(adv) < 1e-9:
                notes.zero_advantage += 1
                continue
            if not _usable(m):
                notes.unusable += 1
                notes.lines.append(
                    f"member {m['member_id']}: no token ids or finite logprobs logged, skipped"
                )
                continue
            keep = None
            if group.kind == "trajectory" and m.get("exchange_ids"):
                keep = [(x, 0) not in in_turn_groups for x in m["exchange_ids"]]
                notes.trained_elsewhere += keep.count(False)
            tokens, mask, old, unaligned = sequence(
                m["prompt_ids"], m["completion_ids"], m["logprobs"], keep
            )
            notes.unaligned_turns += unaligned
            if len(tokens) > s.max_tokens_per_member:
                notes.too_long += 1
                notes.lines.append(
                    f"member {m['member_id']}: {len(tokens)} tokens, above "
                    f"trainer.max_tokens_per_member ({s.max_tokens_per_member}), skipped"
                )
                continue
            if any(mask):
                sampler = m.get("checkpoint") or None
                group.members.append(
                    Sequence(m["member_id"], tokens, mask, old, adv, m["reward"], sampler)
                )
        if group.members:
            groups.append(group)
        else:
            _skip(notes, group_id, "no member left to train (see the lines above)")
    _summarise(notes)
    return groups, notes


def _summarise(notes: Notes) -> None:
    """The counts of what was masked or left out, each a line of the run's notes."""
    if notes.zero_advantage:
        notes.lines.append(f"{notes.zero_advantage} members at their group's mean: no gradient")
    if notes.unaligned_turns:
        notes.lines.append(
            f"{notes.unaligned_turns} earlier turns not found in their conversation's final "
            "tokens (the chat template re-rendered them): masked"
        )
    if notes.trained_elsewhere:
        notes.lines.append(
            f"{notes.trained_elsewhere} conversation turns are trained in their own turn "
            "group: masked in the conversation"
        )
    if notes.outside_baseline:
        notes.lines.append(
            f"{notes.outside_baseline} logged answers sampled under other settings than their "
            "re-sampled rivals: scored against the rivals' mean, not part of it"
        )


def _skip(notes: Notes, group_id: str, why: str) -> None:
    notes.skipped[group_id] = why
    notes.lines.append(f"group {group_id}: {why}, skipped")


def _baseline(members: list[dict]) -> list[bool]:
    """Which members the group's baseline averages: in a turn group whose logged answer was
    sampled under other settings (temperature, top-p) than its re-sampled rivals, the
    rivals only; otherwise everyone. (Snapshots without these columns: everyone.)"""
    settings = [(m.get("temperature"), m.get("top_p")) for m in members]
    sampled = {st for m, st in zip(members, settings, strict=True) if m.get("origin") == "sampled"}
    if len(sampled) != 1:
        return [True] * len(members)
    (rivals,) = sampled
    return [st == rivals for st in settings]


def _other_definitions(members: list[dict]) -> list[str]:
    """The logprob definitions other than TRAINED that the group's turns were sampled
    under (`onjob.logprobs`). Turns logged before the definition was recorded (None)
    count as TRAINED: onjob's vLLM launcher has always passed it."""
    modes = {mode for m in members for mode in m.get("logprobs_modes") or ()}
    return sorted(mode for mode in modes if mode is not None and mode != TRAINED)


def _usable(m: dict) -> bool:
    turns = zip(m["prompt_ids"] or [], m["completion_ids"] or [], m["logprobs"] or [], strict=False)
    return bool(m["prompt_ids"]) and all(
        p and c and lp is not None and len(c) == len(lp) and all(map(math.isfinite, lp))
        for p, c, lp in turns
    )
