"""The held-out slice: scenarios no checkpoint trains on, where a candidate is tested
before it may serve anyone (`release.offline_test`): is it worse than live there?

A fixed share of scenarios (`loop.holdout_share`, by a hash of the scenario id, so the
slice is the same on every run and every host) never enters a training snapshot nor a
judge pass; its prompts (`prompts.held_out`) are answered by the candidate and live and
judged by the referee: a test of their own (`pairs.held_out`), not the release test's.
"""

from __future__ import annotations

import hashlib


def share(scenario_id: str) -> float:
    """Where a scenario falls in [0, 1): below `loop.holdout_share`, it is held out."""
    digest = hashlib.blake2b(f"holdout\x00{scenario_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def held_out(store, fraction: float) -> list[str]:
    """The held-out scenario ids. Each scenario's place is decided once, the first time
    this is called after it appears (in the order scenarios were first seen), and stored
    in `holdout_slice`: held out when its `share` is below `fraction` and some scenario
    seen before it is trained on (one scenario cannot be both trained on and held out).
    A decision never changes afterwards, whatever later scenarios or `fraction` do: a
    scenario trained on never becomes held out, and one held out is never trained on."""
    with store.transaction():
        new = store.column(
            "SELECT s.id FROM scenarios s ANTI JOIN holdout_slice h ON h.scenario_id = s.id "
            "ORDER BY s.first_seen NULLS LAST, s.id"
        )
        trained = store.scalar("SELECT count(*) AS n FROM holdout_slice WHERE NOT held")
        decided = []
        for scenario_id in new:
            place = share(scenario_id)
            held = place < fraction and trained > 0
            trained += not held
            decided.append([scenario_id, held, place])
        if decided:
            store.con.executemany(
                "INSERT INTO holdout_slice (scenario_id, held, share, decided) "
                "VALUES (?, ?, ?, now())",
                decided,
            )
    return store.column("SELECT scenario_id FROM holdout_slice WHERE held ORDER BY scenario_id")
