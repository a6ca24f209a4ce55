"""What the loop has achieved, read from the tables: the reward of each checkpoint's
re-sampled groups over time, and the deployments between them. The admin status, the
demo's plot and its closing table all read these."""

from __future__ import annotations

from ..collector import Store


def group_rewards(store: Store, since=None) -> list[dict]:
    """Every scored turn group in time order: when, which checkpoint sampled it (None: the
    base model), and its members' mean `combined` reward."""
    return store.query(
        """
        SELECT g.id, g.created, g.checkpoints[1] AS checkpoint, avg(s.score) AS reward,
               count(*) AS members
        FROM groups g JOIN scores s ON s.group_id = g.id AND s.source = 'combined'
        WHERE g.kind = 'turn' AND g.status = 'scored' AND (? IS NULL OR g.created >= ?)
        GROUP BY ALL ORDER BY g.created
        """,
        [since, since],
    )


def reward_by_checkpoint(store: Store) -> list[dict]:
    """Per sampling checkpoint, in order of first use: groups, their mean reward, and when."""
    return store.query(
        """
        SELECT g.checkpoints[1] AS checkpoint, count(DISTINCT g.id) AS groups,
               avg(s.score) AS reward, min(g.created) AS first, max(g.created) AS last
        FROM groups g JOIN scores s ON s.group_id = g.id AND s.source = 'combined'
        WHERE g.kind = 'turn' AND g.status = 'scored'
        GROUP BY ALL ORDER BY first
        """
    )
