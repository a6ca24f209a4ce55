"""Scenarios that have settled: each of their last few scored groups gave every member the
same reward. GRPO learns nothing from such a group (no member beats its group's mean),
and a scenario that gave one tends to give another, so the judge re-samples these
scenarios after the others (`tables.turn_candidates`): less often, never excluded, since
the policy moves and a settled scenario may spread again."""

from __future__ import annotations

from ..collector import Store

# Rewards this close count as equal: the trainer's `min_spread` default.
EQUAL = 1e-6


def settled_scenarios(store: Store, last: int) -> list[str]:
    """The scenarios whose `last` most recent scored groups (turn and trajectory) each had
    all-equal combined rewards; none when `last` is 0."""
    if last <= 0:
        return []
    return store.column(
        """
        WITH spread AS (
            SELECT g.scenario_id, g.created, max(s.score) - min(s.score) AS spread,
                   row_number() OVER (PARTITION BY g.scenario_id ORDER BY g.created DESC) AS nth
            FROM groups g JOIN scores s ON s.group_id = g.id AND s.source = 'combined'
            WHERE g.status = 'scored' AND g.kind <> 'ab' AND g.scenario_id IS NOT NULL
            GROUP BY g.id, g.scenario_id, g.created
        )
        SELECT scenario_id FROM spread WHERE nth <= ?
        GROUP BY scenario_id HAVING count(*) = ? AND max(spread) <= ?
        """,
        [last, last, EQUAL],
    )
