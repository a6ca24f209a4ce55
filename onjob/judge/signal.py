"""Whether the scored groups carry anything to learn from: GRPO learns only from a group
whose members' rewards differ. A group whose members all scored alike (all 0: the model
never succeeds there; all 1: it always does) teaches nothing, and re-sampling its
scenario again mostly buys another such group.

    silent scenario  its last `SILENT_GROUPS` scored groups all flat, the newest scored
                     within `SILENT_S`: the judge re-samples it no more until then (DAPO's
                     dynamic sampling, per scenario: the engine's time goes to prompts
                     that still split the model's answers)
    Signal           the last ten minutes' scored groups of some keys: how many were
                     flat (all 0, all 1, other), and the silent scenarios; `line` says it
                     in words for `onjob status` and the dashboard, with what to change
"""

from __future__ import annotations

import msgspec

from ..collector import Store

SILENT_GROUPS = 2  # flat groups in a row that make a scenario silent
SILENT_S = 1800  # how long a silent scenario is left alone before it is tried again
WINDOW_S = 600  # the window `Signal` reads
FLAT = 1e-6  # a spread of rewards at most this: every member alike
MOSTLY = 0.8  # a window this flat is said to carry no signal

_FLATNESS = f"""
    SELECT g.id, g.scenario_id, g.created, max(s.score) - min(s.score) <= {FLAT} AS flat,
           max(s.score) AS top
    FROM groups g JOIN scores s ON s.group_id = g.id AND s.source = 'combined'
    WHERE g.status = 'scored' AND g.kind IN ('turn', 'trajectory')
    GROUP BY g.id, g.scenario_id, g.created
"""


def silent_scenarios(store: Store) -> list[str]:
    """The scenarios whose last `SILENT_GROUPS` scored groups were all flat, the newest of
    them scored within `SILENT_S`."""
    return store.column(
        f"""
        WITH f AS ({_FLATNESS}), ranked AS (
            SELECT *, row_number() OVER (PARTITION BY scenario_id ORDER BY created DESC) AS nth
            FROM f WHERE scenario_id IS NOT NULL)
        SELECT scenario_id FROM ranked WHERE nth <= {SILENT_GROUPS}
        GROUP BY scenario_id
        HAVING count(*) = {SILENT_GROUPS} AND bool_and(flat)
           AND max(created) > now() - INTERVAL {SILENT_S} SECOND
        ORDER BY scenario_id
        """
    )


class Signal(msgspec.Struct, frozen=True, kw_only=True):
    """The last `WINDOW_S` of scored groups (every key's, or some keys'), and what it says."""

    scored: int = 0
    flat: int = 0
    all_zero: int = 0  # flat at 0: the model never succeeds there
    all_top: int = 0  # flat at 1: it always does
    silent: int = 0  # scenarios the judge leaves alone for now
    line: str = ""

    @property
    def none(self) -> bool:
        """Whether the window carries (almost) nothing to learn from."""
        return self.scored > 0 and self.flat >= MOSTLY * self.scored


class _Counts(msgspec.Struct, frozen=True, kw_only=True):
    """The window's scored groups, counted (`signal`)."""

    scored: int
    flat: int
    all_zero: int
    all_top: int


def signal(store: Store, keys_sql: str = "true", params: list | None = None) -> Signal:
    """The window's `Signal`; `keys_sql` (on `e.api_key_id`) narrows it to some keys."""
    row = store.rows(
        _Counts,
        f"""
        WITH f AS ({_FLATNESS})
        SELECT count(*) AS scored, count(*) FILTER (flat) AS flat,
               count(*) FILTER (flat AND top <= 0) AS all_zero,
               count(*) FILTER (flat AND top >= 1) AS all_top
        FROM f WHERE f.created > now() - INTERVAL {WINDOW_S} SECOND
          AND EXISTS (SELECT 1 FROM members m JOIN exchanges e ON e.id = m.exchange_id
                      WHERE m.group_id = f.id AND {keys_sql})
        """,
        params or [],
    )[0]
    s = Signal(
        scored=int(row.scored),
        flat=int(row.flat),
        all_zero=int(row.all_zero),
        all_top=int(row.all_top),
        silent=len(silent_scenarios(store)),
    )
    return msgspec.structs.replace(s, line=_line(s))


def _line(s: Signal) -> str:
    if not s.scored:
        return "no group scored in the last 10 minutes"
    said = (
        f"{s.scored - s.flat} of {s.scored} groups scored in the last 10 minutes have a "
        f"spread of rewards to learn from"
    )
    if s.silent:
        said += f"; {s.silent} scenarios re-sampled no more for now (their groups were flat)"
    if not s.none:
        return said
    why = (
        "every member scored 0: the model never succeeds, so the reward needs partial credit "
        "for the step before success (or a larger judge.group_size)"
        if s.all_zero >= s.flat / 2
        else "every member scored alike"
    )
    return f"NO SIGNAL: {said}; {s.flat} were flat ({why})"
