"""The sampler check, once before the first update: each group's logprobs under the
weights that sampled it against the logged ones.

    for each sampler among a group's members (the run's start, the base model, or an
    earlier checkpoint of the lineage, loaded beside the policy for the check):
        gap = |policy's logprob - logged logprob| on the group's first chunk
    a group whose gap per token is past `trainer.max_logprob_gap` was sampled by other
    weights, tokenizer or template: skipped, its reason named

Drift the run's own updates cause, and the lineage's since an earlier checkpoint sampled
a group, is the importance ratio's job (CISPO's capped weights), not a reason to skip a
group; only a real mismatch is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from . import adapter
from .data import Group, Notes, Sequence
from .forward import Policy, chunks, sampled_logprobs, sampler_logprobs
from .settings import TrainSettings

_SAMPLER = "sampler"  # the adapter name an earlier checkpoint is loaded under for the check


@dataclass(frozen=True)
class Gap:
    """How far the policy's logprobs were from the logged ones before the first update:
    |logp - old| summed over a group's first chunk, its max, and the tokens (the same
    weights as the sampler's, so ~0 up to numerics and dtypes)."""

    sum: float
    max: float
    tokens: int

    @property
    def mean(self) -> float:
        return self.sum / max(self.tokens, 1)


@dataclass(frozen=True)
class Checked:
    """Every group's gap, and the groups not to train on with why: those the snapshot's
    loader left out (`Notes.skipped`) and those the check refused."""

    gaps: Mapping[str, Gap]
    skipped: dict[str, str]

    def kept(self, groups: list[Group]) -> list[Group]:
        return [g for g in groups if g.id not in self.skipped]

    @property
    def gap(self) -> float:
        """The gap per token over every group."""
        every = list(self.gaps.values())
        return sum(g.sum for g in every) / max(sum(g.tokens for g in every), 1)

    @property
    def gap_max(self) -> float:
        return max((g.max for g in self.gaps.values()), default=0.0)


def samplers(
    policy: Policy,
    groups: list[Group],
    notes: Notes,
    s: TrainSettings,
    parent: Path | None,
    echo: Callable[[str], None],
) -> Checked:
    """The check (see the module's docstring), with the run's start at `parent` (None: the
    base model)."""
    gaps = _gaps(policy, groups, parent, echo)
    refused = {g.id: why for g in groups if (why := _mismatch(gaps[g.id], s)) is not None}
    for gid, why in refused.items():
        echo(f"group {gid}: {why}, skipped")
    return Checked(gaps, dict(notes.skipped) | refused)


def _mismatch(gap: Gap, s: TrainSettings) -> str | None:
    """Why a group may not train (None: it may): a starting policy that disagrees with the
    logged logprobs by more than `max_logprob_gap` per token was not the sampler, and
    its ratios would be noise."""
    if gap.mean <= s.max_logprob_gap:
        return None
    return (
        f"the policy's logprobs differ from the logged ones by {gap.mean:.3g} per token "
        f"(max {gap.max:.3g}) before the first update: sampled by other weights, tokenizer "
        "or template"
    )


def _gaps(policy: Policy, groups: list[Group], parent: Path | None, echo) -> Mapping[str, Gap]:
    """Each group's gap, its members measured against their sampler's weights: the run's
    start (`parent`, None: the base model), the base model (the adapter off), or an
    earlier checkpoint of the lineage, loaded beside the policy from `parent`'s folder for
    the check and dropped after it. A sampler whose weights this run cannot find is
    measured against the run's start, and said."""
    start = parent.name if parent is not None else None
    by_sampler: dict[str | None, list[Group]] = {}
    for g in groups:
        members: dict[str | None, list[Sequence]] = {}
        for m in g.members:
            members.setdefault(m.sampler, []).append(m)
        for sampler, ms in members.items():
            by_sampler.setdefault(sampler, []).append(Group(g.id, g.kind, ms))
    parts: dict[str, list[Gap]] = {g.id: [] for g in groups}
    for sampler, subgroups in by_sampler.items():
        with _weights_of(policy.model, sampler, start, parent, echo):
            for sub in subgroups:
                parts[sub.id].append(_gap(sub, policy))
    return {
        gid: Gap(sum(p.sum for p in ps), max(p.max for p in ps), sum(p.tokens for p in ps))
        for gid, ps in parts.items()
    }


@contextlib.contextmanager
def _weights_of(model, sampler: str | None, start: str | None, parent: Path | None, echo):
    """The policy's forwards give `sampler`'s logprobs inside (see `_gaps`)."""
    if sampler == start:
        yield
        return
    if sampler is None:
        with model.disable_adapter():
            yield
        return
    path = parent.parent / sampler if parent is not None else None
    if path is None or not (path / "adapter_config.json").exists():
        where = f"beside the run's start ({parent})" if parent else "(the run starts at the base)"
        echo(
            f"groups sampled by {sampler}: its weights are not found {where}; their gap is "
            "measured against the start"
        )
        yield
        return
    model.load_adapter(str(path), adapter_name=_SAMPLER)
    adapter.without_dropout(model)
    model.set_adapter(_SAMPLER)
    try:
        yield
    finally:
        model.set_adapter("default")  # its parameters trainable again, the sampler's not
        model.delete_adapter(_SAMPLER)


def _gap(group: Group, policy: Policy) -> Gap:
    """A group's gap on its first chunk, with no gradient."""
    chunk = next(iter(chunks(group, policy.limit)))
    with torch.no_grad():
        logp = sampled_logprobs(policy.model, policy.head, chunk, policy.device)
        gap = (logp - sampler_logprobs(chunk, policy.device)).abs()
    return Gap(gap.sum().item(), gap.max().item() if gap.numel() else 0.0, gap.numel())
