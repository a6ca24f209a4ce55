"""Which logged prompts a candidate's test may use, and in what order: a sample of the
traffic it would serve, from turns it cannot have trained on.

Every source is production turns of the alias, of the lineage's own API keys (its tenant's,
or for the shared lineage every key no tenant holds; never one in `proxy.untrained_keys`:
`Lineage.scope`), in no conversation the checkpoints' training snapshots hold
(`TRAINED_CONVERSATIONS`: an answer a checkpoint was trained towards is not evidence about
it), no turn whose prompt has the words of one of theirs (`PROMPT_WORDS`: the same
templated request in a new conversation is the same evidence; its later turns, given
other tool results, are not), in no conversation the test already drew from (turns of
one conversation are not independent evidence), in no conversation any turn of which
another arm answered (a canary's, or a rolled-back sibling's, answers in its history are
not live's), one turn per conversation, any turn (tool-call turns included).

The order is random, and reproducible: a resumed test draws the same turns. Turns are
ordered by a hash of their id and the test's name, and a draw takes the next turn in
that order (of its stratum, below) of a conversation the test has not drawn from, so a
conversation of ten turns is drawn about ten times as often as one of one: the sample is
of turns served, not of conversations. Two sources:

- `held_out`: the held-out slice's scenarios (`holdout`), whenever logged; its own test.
- `fresh`: any scenario, logged on the live arm since `since`: the last day (`PROFILE`,
  every hour once: `window_start`) for a candidate whose training is on record. Each draw
  first picks a *stratum* (`Stratum`: whether live's answer called a tool, and the quarter
  of the UTC day) in proportion to the lineage's live turns of that stratum in the same
  window in conversations the test has not drawn (a sample without putting back: a
  conversation drawn takes all its turns out), then the stratum's next turn. What the
  exclusions above take away (training picks tool-call turns; a canary's conversations; the
  test's own draws) is so put back, and the test's mean is the mean over the window's
  traffic; a stratum whose undrawn turns are all ones the test may not use ends the round
  there (`Draw.short`), and the test waits for its traffic rather than read a skewed sample.
  The e-process's guarantee asks each pair's expected difference to be the traffic's,
  whatever came before: a draw depends on the pairs before it only through the turns they
  used up. Live's turns stand for all the traffic: a canary serves a random share of
  conversations, and live's answers are the ones a stratum is read from.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from ...collector import rebuilt
from ...judge.tables import CALLED
from ...proxy.tenants import Lineage

PROFILE = timedelta(days=1)  # the traffic whose mix a fresh sample reproduces
PART_HOURS = 6  # the day in quarters: its strata by time

# Conversations in the training snapshot of a checkpoint or any of its ancestors: the
# lineage's train runs, their groups, and every conversation those groups' members are in.
TRAINED_CONVERSATIONS = """
WITH RECURSIVE chain(name) AS (
    SELECT unnest(?::VARCHAR[])
    UNION
    SELECT c.parent FROM checkpoints c JOIN chain ON c.name = chain.name
    WHERE c.parent IS NOT NULL
), trained AS (
    SELECT unnest(t.groups_used) AS group_id
    FROM checkpoints c JOIN chain ON c.name = chain.name JOIN train_runs t ON t.id = c.train_run
)
SELECT DISTINCT m.trajectory_id FROM members m JOIN trained ON trained.group_id = m.group_id
WHERE m.trajectory_id IS NOT NULL
"""

# A prompt's words, which near-duplicates share: the text of its user messages and tool
# results (what the agent was given, not its own answers or the system prompt), lower-cased,
# anything but letters and digits one space ("Order #1234: late?" and "order 1234 LATE" are
# the same request). Numbers are kept: "What is 3 + 4?" and "What is 5 + 2?" are two
# questions. `r` is a rebuilt row (its full request: linear storage keeps only a delta).
# NULL for a row without chat messages.
PROMPT_WORDS = """
md5(trim(regexp_replace(lower(CAST(list_transform(
    list_filter(CAST(json_extract(r.request, '$.messages') AS JSON[]),
                lambda m: json_extract_string(m, '$.role') IN ('user', 'tool')),
    lambda m: json_extract(m, '$.content')) AS VARCHAR)), '[^a-z0-9]+', ' ', 'g')))
"""


@dataclass(frozen=True, order=True)
class Stratum:
    """A kind of turn the traffic mix is kept in: whether live's logged answer called a
    tool, and the quarter of the UTC day it was logged in."""

    called: bool
    part: int  # 0: 00-06 UTC, 1: 06-12, ...

    def __str__(self) -> str:
        start = self.part * PART_HOURS
        kind = "tool-call turns" if self.called else "answer turns"
        return f"{kind} of {start:02d}-{start + PART_HOURS:02d} UTC"


@dataclass
class Draw:
    """A round's prompts, in the order drawn, and the stratum it stopped short at (None:
    all `n` were drawn, or nothing restricts the source by strata)."""

    prompts: list[dict] = field(default_factory=list)
    short: Stratum | None = None


def held_out(
    store,
    lineage: Lineage,
    scenarios: list[str],
    n: int,
    *,
    chain: list[str | None] | tuple = (),
    tests: list[str] | tuple = (),
) -> list[dict]:
    """Up to `n` of `lineage`'s prompts of the held-out `scenarios` for a test of the
    checkpoints in `chain` (live and the candidate; their ancestors are followed) that drew
    from `tests` so far."""
    if not scenarios:
        return []
    where = "list_contains(?::VARCHAR[], e.scenario_id)"
    return _choose(store, lineage, where, [scenarios], n, chain, tests, None).prompts


def fresh(
    store,
    lineage: Lineage,
    since: datetime,
    n: int,
    *,
    chain: list[str | None] | tuple = (),
    tests: list[str] | tuple = (),
) -> Draw:
    """Up to `n` of `lineage`'s prompts logged on the live arm after `since`, any
    scenario, in the mix of that window's traffic."""
    where = "e.arm = 'live' AND e.ts > ?"
    profile = _profile(store, lineage, since, tests)
    return _choose(store, lineage, where, [since], n, chain, tests, profile)


def window_start(store, checkpoint: str, now: datetime | None = None) -> datetime | None:
    """The earliest a fresh prompt of the checkpoint's test may be logged: `PROFILE`
    before `now` when a train run recorded what it trained on (those conversations and
    their likes are left out: anything else it never saw), None for an adapter added by
    hand (nothing says what it saw; its canary draws from its own start)."""
    rows = store.query(
        "SELECT 1 FROM checkpoints c JOIN train_runs t ON t.id = c.train_run WHERE c.name = ?",
        [checkpoint],
    )
    return (now or datetime.now(UTC)) - PROFILE if rows else None


# A turn's stratum, in SQL: live's answer called a tool (`judge.tables.CALLED`), and the
# quarter of the UTC day.
_PART = f"CAST(hour(timezone('UTC', e.ts)) // {PART_HOURS} AS INTEGER)"
# The conversations `tests` (a parameter) drew a pair from.
_DRAWN = """
SELECT p.trajectory_id FROM groups g JOIN exchanges p ON p.id = g.prefix_exchange
WHERE g.kind = 'ab' AND list_contains(?::VARCHAR[], g.test)
"""


def _profile(store, lineage: Lineage, start: datetime, tests) -> dict[Stratum, int]:
    """The lineage's answered production turns on the live arm per stratum since `start`
    (the traffic a candidate would serve), but those of conversations `tests` drew: the
    test samples that traffic without putting back."""
    mine, scope = lineage.scope.sql("e.api_key_id")
    rows = store.query(
        f"SELECT {CALLED} AS called, {_PART} AS part, count(*) AS n FROM exchanges e "
        "WHERE e.status < 400 AND e.source = 'production' AND e.model_alias = ? "
        f"AND e.arm = 'live' AND e.ts > ? AND {mine} "
        f"AND e.trajectory_id NOT IN ({_DRAWN}) GROUP BY ALL",
        [lineage.alias, start, *scope, list(tests)],
    )
    return {Stratum(r["called"], r["part"]): r["n"] for r in rows}


def _choose(store, lineage, where, params, n, chain, tests, profile) -> Draw:
    """The turns the source allows, in hash order, one per conversation; drawn by stratum
    when `profile` is given, else in that order."""
    key = tests[0] if tests else ""
    chain = [c for c in chain if c]
    mine, scope = lineage.scope.sql("e.api_key_id")
    turns = store.query(
        f"""
        WITH trained AS ({TRAINED_CONVERSATIONS}),
        seen AS (  -- every prompt of a trained conversation, by its words
            SELECT DISTINCT {PROMPT_WORDS} AS words
            FROM exchanges_rebuilt((SELECT list(id) FROM exchanges
                                    WHERE trajectory_id IN (FROM trained)), false) r
        ), source AS (
            SELECT e.id, e.trajectory_id, {CALLED} AS called, {_PART} AS part
            FROM exchanges e
            WHERE e.status < 400 AND e.source = 'production' AND e.model_alias = ?
              AND {where} AND {mine}
              AND e.trajectory_id NOT IN (FROM trained)
              AND e.trajectory_id NOT IN ({_DRAWN})
              AND e.trajectory_id NOT IN (
                  SELECT trajectory_id FROM exchanges
                  WHERE arm <> 'live' AND source = 'production' AND trajectory_id IS NOT NULL)
        ), worded AS (
            SELECT s.*, {PROMPT_WORDS} AS words FROM source s
            JOIN exchanges_rebuilt((SELECT list(id) FROM source), false) r ON r.id = s.id
        )
        SELECT id, trajectory_id, called, part,
               words IS NULL OR words NOT IN (SELECT words FROM seen WHERE words IS NOT NULL)
                   AS usable
        FROM worded ORDER BY hash(id, ?), id
        """,
        [chain, lineage.alias, *params, *scope, list(tests), key],
    )
    draw = _draw(turns, n, profile, f"{key}:{pairs_made(store, tests)}")
    if draw.prompts:
        ids = [t["id"] for t in draw.prompts]
        chosen = rebuilt("SELECT unnest(?::VARCHAR[]) AS id")
        rows = {r["id"]: r for r in store.query(f"SELECT * FROM {chosen}", [ids])}
        draw.prompts = [rows[i] for i in ids]
    return draw


def _draw(turns: list[dict], n: int, profile: dict[Stratum, int] | None, seed: str) -> Draw:
    """Up to `n` of the usable `turns` (in their order), one per conversation: the first
    `n`, or with a `profile`, each draw a stratum picked at the odds of the profile's turns
    not drawn yet and that stratum's next turn. A conversation drawn takes all its turns
    out of the profile (the test will not draw them), as a later round's profile does."""
    usable = [t for t in turns if t["usable"]]
    if profile is None:
        firsts = {}  # each conversation's first usable turn, in order
        for t in usable:
            firsts.setdefault(t["trajectory_id"], t)
        return Draw(list(firsts.values())[:n])
    queues: dict[Stratum, list[dict]] = {}
    for t in usable:
        queues.setdefault(Stratum(t["called"], t["part"]), []).append(t)
    strata_of: dict[str, list[Stratum]] = {}  # each conversation's turns, usable or not
    for t in turns:
        strata_of.setdefault(t["trajectory_id"], []).append(Stratum(t["called"], t["part"]))
    left = dict(profile)
    strata = sorted(left)
    rng, out, used = random.Random(seed), [], set()
    while len(out) < n and any(left.values()):
        stratum = rng.choices(strata, weights=[left[s] for s in strata])[0]
        queue = queues.get(stratum, [])
        while queue and queue[0]["trajectory_id"] in used:
            queue.pop(0)
        if not queue:  # its turns not drawn yet are all ones the test may not use
            return Draw(out, stratum)
        turn = queue.pop(0)
        out.append(turn)
        used.add(turn["trajectory_id"])
        for s in strata_of[turn["trajectory_id"]]:
            if s in left:  # a turn logged since the profile was read is not in it
                left[s] = max(0, left[s] - 1)
    return Draw(out)


def pairs_made(store, tests) -> int:
    """How many pairs `tests` made so far (a resumed round goes on from there)."""
    rows = store.query(
        "SELECT count(*) AS n FROM groups WHERE kind = 'ab' AND list_contains(?::VARCHAR[], test)",
        [list(tests)],
    )
    return rows[0]["n"]
