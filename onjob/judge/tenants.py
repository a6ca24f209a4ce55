"""Tenants in the judge: one API key's traffic per group, and none of an untrained key's.

A group is what RULER sees in one prompt, and what one GRPO advantage compares, so a group
that held two keys' conversations would show one key's prompts and answers to a judge
call made for another's, and train each on the other's. Groups are built one key's at a
time (`tables.turn_candidates`, `tables.scenario_candidates`: a re-sampled answer is its
source's key's); `refusal` is the check at the door of scoring, for groups built before
that rule or by hand, and for keys listed in `proxy.untrained_keys` after their groups were
made: such a group is `failed` with the reason, and no scorer sees it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .tables import ExchangeOwner

RESAMPLE = "resample"  # `exchanges.source` of an answer the judge or a comparison sampled


def member_keys(owners: Iterable[ExchangeOwner]) -> set[str | None]:
    """The API keys of a group's members' exchanges (`tables.owners` rows). A re-sampled
    answer logged before samples carried their source's key has none: it answers its
    group's logged request, so it adds no key of its own."""
    return {o.api_key_id for o in owners if o.api_key_id is not None or o.source != RESAMPLE}


def refusal(keys: Iterable[str | None], untrained: Collection[str] = ()) -> str | None:
    """Why a group whose members belong to API keys `keys` (None: a server with no keys)
    must not be judged; None when it may."""
    mine = set(keys)
    if len(mine) > 1:
        return f"members of {len(mine)} API keys: one key's traffic is never judged with another's"
    listed = sorted(k for k in mine if k is not None and k in untrained)
    if listed:
        return f"API key {listed[0]!r} is in proxy.untrained_keys: its traffic is never judged"
    return None
