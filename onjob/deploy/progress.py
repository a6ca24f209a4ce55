"""What the loop has achieved, read from the tables: the reward of each checkpoint's
re-sampled groups over time, and the deployments between them. The admin status, the
demo's plot and its closing table all read these."""

from __future__ import annotations

from datetime import datetime

import msgspec

from ..collector import Store


class GroupReward(msgspec.Struct, frozen=True, kw_only=True):
    """A scored turn group (`group_rewards`): when, which checkpoint sampled it (None: the
    base model), its members' mean `combined` reward, and how many members."""

    id: str
    created: datetime | None
    checkpoint: str | None
    reward: float
    members: int


class CheckpointReward(msgspec.Struct, frozen=True, kw_only=True):
    """A sampling checkpoint's scored turn groups (`reward_by_checkpoint`; None: the base
    model): how many, their mean reward, and the first and last. Sent by the admin API
    as the JSON object it always was."""

    checkpoint: str | None
    groups: int
    reward: float
    first: datetime | None
    last: datetime | None


def group_rewards(store: Store, since: datetime | None = None) -> list[GroupReward]:
    """Every scored turn group in time order: when, which checkpoint sampled it (None: the
    base model), and its members' mean `combined` reward."""
    return store.rows(
        GroupReward,
        """
        SELECT g.id, g.created, g.checkpoints[1] AS checkpoint, avg(s.score) AS reward,
               count(*) AS members
        FROM groups g JOIN scores s ON s.group_id = g.id AND s.source = 'combined'
        WHERE g.kind = 'turn' AND g.status = 'scored' AND (? IS NULL OR g.created >= ?)
        GROUP BY ALL ORDER BY g.created
        """,
        [since, since],
    )


def reward_by_checkpoint(store: Store) -> list[CheckpointReward]:
    """Per sampling checkpoint, in order of first use: groups, their mean reward, and when."""
    return store.rows(
        CheckpointReward,
        """
        SELECT g.checkpoints[1] AS checkpoint, count(DISTINCT g.id) AS groups,
               avg(s.score) AS reward, min(g.created) AS first, max(g.created) AS last
        FROM groups g JOIN scores s ON s.group_id = g.id AND s.source = 'combined'
        WHERE g.kind = 'turn' AND g.status = 'scored'
        GROUP BY ALL ORDER BY first
        """,
    )
