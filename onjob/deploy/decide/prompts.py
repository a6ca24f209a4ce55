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
not live's), any turn (tool-call turns included).

The order is random, and reproducible: a resumed test draws the same turns. Turns are
ordered by a hash of their id and the test's name, and a draw takes the next turn in
that order (of its stratum, below) of a conversation the test has not drawn from, so a
conversation of ten turns is drawn about ten times as often as one of one: the sample is
of turns served, not of conversations. A fresh draw then takes that conversation's other
usable turns too (`TURNS_PER_DRAW` in all at most, the rest in hash order) and the pair
is their mean difference (`pairs`: one pair per conversation, so pairs stay independent
evidence); where the source holds `PLENTY` undrawn conversations for each pair a round
wants, the drawn turn alone is the pair (the engine, not the traffic, is then what the
test waits on, and one turn gives more evidence per answer sampled than a mean of four).
Its expected difference is still the day's mean over the turns served: a conversation is
drawn at the odds of its turns, and its pair is the mean of its turns (of all of them,
or of the drawn one and a random few). A quiet three-turn tool agent, whose test runs
out of conversations before it runs out of engine, so gives three turns' evidence per
conversation where it gave one; a busy one's test pairs a turn at a third of the
engine's time. Two sources:

- `held_out`: the held-out slice's scenarios (`holdout`), whenever logged; its own test,
  one turn per conversation.
- `fresh`: any scenario, logged on the live arm since `since`: the last day (`PROFILE`,
  every hour once: `window_start`) for a candidate whose training is on record. Each draw
  first picks a *stratum* (`Stratum`: whether live's answer called a tool, the quarter of
  the UTC day, and how many turns its conversation served in the window, `LENGTHS`) at the
  odds of the lineage's live turns of that stratum in the window, all of them (the day's
  mix, the same at every draw), then the stratum's next turn of a conversation the test
  has not drawn. What the exclusions above take away (training picks tool-call turns; a
  canary's conversations; the test's own draws) is so put back; a stratum whose undrawn
  turns are all ones the test may not use ends the round there (`Draw.short`), and the
  test waits for its traffic rather than read a skewed sample.

  Why conversation length is a stratum and the odds stay fixed: a draw takes one turn and
  its whole conversation out, so a ten-turn conversation leaves ten turns' weight for one
  pair. With odds by the turns *left*, long conversations ran out first and the turns
  drawn late were the short ones' (bench/release/decisions.py's low-traffic agent case: a
  candidate no better over the turns served, better on short conversations, was promoted
  at twice its level). Within a length the conversations are alike in weight, so the next
  undrawn one is as good as any; across lengths the odds are the day's. Each pair's
  expected difference is then the day's mean over the turns served, whatever was drawn
  before it, which is what the e-process's guarantee asks. The price: a long stratum runs
  out after about (the day's turns / its conversations' length) pairs, and the test then
  waits for more of it; `shortfalls` says so before a test starts. Live's turns stand for
  all the traffic: a canary serves a random share of conversations, and live's answers
  are the ones a stratum is read from.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import msgspec

from ...collector import rebuilt
from ...judge.tables import CALLED, LOGGED_TURN, LoggedTurn
from ...proxy.tenants import Lineage

PROFILE = timedelta(days=1)  # the traffic whose mix a fresh sample reproduces
PART_HOURS = 6  # the day in quarters: its strata by time
# A conversation's turns in the window, from these up: 1, 2-3, 4-7, 8 or more. Doubling
# keeps the weights of one stratum's conversations within a factor of two.
LENGTHS = (1, 2, 4, 8)
# The turns one draw of a fresh sample answers from its conversation: the pair is their
# mean difference. Four keep a long agent run's pair at four turns' cost.
TURNS_PER_DRAW = 4
# Undrawn conversations per pair a round wants, from which a draw answers the one turn it
# drew: conversations are then not what the test runs short of, the engine is, and a
# turn's pair is the most evidence per answer sampled (`_draw`).
PLENTY = 3

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
    tool, the quarter of the UTC day it was logged in, and its conversation's length."""

    called: bool
    part: int  # 0: 00-06 UTC, 1: 06-12, ...
    length: int = 0  # the index in LENGTHS of its conversation's turns in the window

    def __str__(self) -> str:
        start = self.part * PART_HOURS
        kind = "tool-call turns" if self.called else "answer turns"
        low = LENGTHS[self.length]
        high = f"-{LENGTHS[self.length + 1] - 1}" if self.length + 1 < len(LENGTHS) else "+"
        turns = "1-turn conversations" if low == 1 else f"conversations of {low}{high} turns"
        return f"{kind} of {start:02d}-{start + PART_HOURS:02d} UTC in {turns}"


class Turn(msgspec.Struct, frozen=True, kw_only=True):
    """A turn of a test's source (`source_turns`): its stratum's parts, and whether the
    test may use it (no prompt of a trained conversation has its words)."""

    id: str
    trajectory_id: str
    called: bool
    part: int
    length: int
    usable: bool

    @property
    def stratum(self) -> Stratum:
        return Stratum(self.called, self.part, self.length)


@dataclass
class Draw:
    """A round's prompts, in the order drawn, and the stratum it stopped short at (None:
    all `n` were drawn, or nothing restricts the source by strata)."""

    prompts: list[LoggedTurn] = field(default_factory=list)
    short: Stratum | None = None


def held_out(
    store,
    lineage: Lineage,
    scenarios: list[str],
    n: int,
    *,
    chain: list[str | None] | tuple = (),
    tests: list[str] | tuple = (),
) -> list[LoggedTurn]:
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
    """The turns of up to `n` of `lineage`'s conversations logged on the live arm after
    `since`, any scenario, drawn in the mix of that window's traffic (`_draw`)."""
    where = "e.arm = 'live' AND e.ts > ?"
    profile = _profile(store, lineage, since)
    return _choose(store, lineage, where, [since], n, chain, tests, profile)


def shortfalls(
    store,
    lineage: Lineage,
    since: datetime,
    pairs: float,
    *,
    chain: list[str | None] | tuple = (),
    tests: list[str] | tuple = (),
) -> list[str]:
    """The strata a test that draws `pairs` more pairs from the traffic since `since`
    would use up, each in words: its odds times `pairs` is more than the conversations
    it has left to draw from. Said before the test starts, and as it goes: it will wait
    for more of that traffic when it gets there."""
    if pairs <= 0:
        return []
    profile = _profile(store, lineage, since)
    total = sum(profile.values())
    turns = source_turns(store, lineage, "e.arm = 'live' AND e.ts > ?", [since], chain, tests)
    left: dict[Stratum, set[str]] = {}
    for t in turns:
        if t.usable:
            left.setdefault(t.stratum, set()).add(t.trajectory_id)
    out = []
    for stratum, n in sorted(profile.items()):
        wanted = pairs * n / total
        have = len(left.get(stratum, ()))
        if wanted > have:
            out.append(
                f"would use up {stratum} ({have} conversations left, about {wanted:.0f} "
                "draws wanted): it waits for more of them when it gets there"
            )
    return out


def window_start(store, checkpoint: str, now: datetime | None = None) -> datetime | None:
    """The earliest a fresh prompt of the checkpoint's test may be logged: `PROFILE`
    before `now` when a train run recorded what it trained on (those conversations and
    their likes are left out: anything else it never saw), None for an adapter added by
    hand (nothing says what it saw; its canary draws from its own start)."""
    recorded = store.scalar(
        "SELECT 1 FROM checkpoints c JOIN train_runs t ON t.id = c.train_run WHERE c.name = ?",
        [checkpoint],
    )
    return (now or datetime.now(UTC)) - PROFILE if recorded is not None else None


# A turn's stratum, in SQL: live's answer called a tool (`judge.tables.CALLED`), the
# quarter of the UTC day, and its conversation's length (`_LENGTH`, of a column `turns`).
_PART = f"CAST(hour(timezone('UTC', e.ts)) // {PART_HOURS} AS INTEGER)"
_TURNS = "count(*) OVER (PARTITION BY e.trajectory_id)"
_LENGTH = (
    "CASE "
    + " ".join(f"WHEN turns >= {n} THEN {i}" for i, n in reversed(list(enumerate(LENGTHS))))
    + " ELSE 0 END"
)
# The conversations `tests` (a parameter) drew a pair from.
_DRAWN = """
SELECT p.trajectory_id FROM groups g JOIN exchanges p ON p.id = g.prefix_exchange
WHERE g.kind = 'ab' AND list_contains(?::VARCHAR[], g.test)
"""


class _Counted(msgspec.Struct, frozen=True, kw_only=True):
    """A stratum's turns in the window (`_profile`)."""

    called: bool
    part: int
    length: int
    n: int


def _profile(store, lineage: Lineage, start: datetime) -> Mapping[Stratum, int]:
    """The lineage's answered production turns on the live arm per stratum since `start`:
    the traffic a candidate would serve, every turn of it (the conversations a test drew
    included: the odds of a stratum stay the day's, however many pairs were drawn)."""
    mine, scope = lineage.scope.sql("e.api_key_id")
    rows = store.rows(
        _Counted,
        f"SELECT called, part, {_LENGTH} AS length, count(*) AS n FROM ("
        f"SELECT {CALLED} AS called, {_PART} AS part, {_TURNS} AS turns FROM exchanges e "
        "WHERE e.status < 400 AND e.source = 'production' AND e.model_alias = ? "
        f"AND e.arm = 'live' AND e.ts > ? AND {mine}) GROUP BY ALL",
        [lineage.alias, start, *scope],
    )
    return {Stratum(r.called, r.part, r.length): r.n for r in rows}


def _choose(store, lineage, where, params, n, chain, tests, profile) -> Draw:
    """The turns the source allows, in hash order, of up to `n` conversations (`_draw`):
    drawn by stratum when `profile` is given, else in that order."""
    key = tests[0] if tests else ""
    turns = source_turns(store, lineage, where, params, chain, tests)
    drawn, short = _draw(turns, n, profile, f"{key}:{pairs_made(store, tests)}")
    if not drawn:
        return Draw([], short)
    ids = [t.id for t in drawn]
    chosen = rebuilt("SELECT unnest(?::VARCHAR[]) AS id")
    rows = {r.id: r for r in store.rows(LoggedTurn, f"SELECT {LOGGED_TURN} FROM {chosen} e", [ids])}
    return Draw([rows[i] for i in ids], short)


def source_turns(store, lineage, where, params, chain, tests) -> list[Turn]:
    """The turns of the source, in the test's hash order, each with its stratum and
    whether the test may use it. `where` (with `params`) narrows `exchanges e`; `chain`
    and `tests` are the lineage's checkpoints and its tests, as `fresh` and `shortfalls`
    pass them (bench/release/decisions.py replays an older draw on these turns)."""
    key = tests[0] if tests else ""
    chain = [c for c in chain if c]
    mine, scope = lineage.scope.sql("e.api_key_id")
    return store.rows(
        Turn,
        f"""
        WITH trained AS ({TRAINED_CONVERSATIONS}),
        seen AS (  -- every prompt of a trained conversation, by its words
            SELECT DISTINCT {PROMPT_WORDS} AS words
            FROM exchanges_rebuilt((SELECT list(id) FROM exchanges
                                    WHERE trajectory_id IN (FROM trained)), false) r
        ), windowed AS (  -- every turn of the window, its conversation's turns counted
            SELECT e.id, e.trajectory_id, {CALLED} AS called, {_PART} AS part,
                   {_TURNS} AS turns
            FROM exchanges e
            WHERE e.status < 400 AND e.source = 'production' AND e.model_alias = ?
              AND {where} AND {mine}
        ), source AS (
            SELECT e.id, e.trajectory_id, e.called, e.part, {_LENGTH} AS length
            FROM windowed e
            WHERE e.trajectory_id NOT IN (FROM trained)
              AND e.trajectory_id NOT IN ({_DRAWN})
              AND e.trajectory_id NOT IN (
                  SELECT trajectory_id FROM exchanges
                  WHERE arm <> 'live' AND source = 'production' AND trajectory_id IS NOT NULL)
        ), worded AS (
            SELECT s.*, {PROMPT_WORDS} AS words FROM source s
            JOIN exchanges_rebuilt((SELECT list(id) FROM source), false) r ON r.id = s.id
        )
        SELECT id, trajectory_id, called, part, length,
               words IS NULL OR words NOT IN (SELECT words FROM seen WHERE words IS NOT NULL)
                   AS usable
        FROM worded ORDER BY hash(id, ?), id
        """,
        [chain, lineage.alias, *params, *scope, list(tests), key],
    )


def _draw(
    turns: list[Turn], n: int, profile: Mapping[Stratum, int] | None, seed: str
) -> tuple[list[Turn], Stratum | None]:
    """Up to `n` conversations' usable `turns` (in their order): the first turn of each of
    the first `n`, or with a `profile`, each draw a stratum picked at the odds of the
    profile's turns (the day's, fixed), that stratum's next turn of a conversation not
    drawn yet, and (unless the source holds `PLENTY` conversations a pair) the
    conversation's other turns (`_unit`). With the stratum it stopped short at (`Draw`)."""
    usable = [t for t in turns if t.usable]
    if profile is None:
        firsts: dict[str, Turn] = {}  # each conversation's first usable turn, in order
        for t in usable:
            firsts.setdefault(t.trajectory_id, t)
        return list(firsts.values())[:n], None
    queues: dict[Stratum, list[Turn]] = {}
    for t in usable:
        queues.setdefault(t.stratum, []).append(t)
    conversations: dict[str, list[Turn]] = {}  # each one's usable turns, in hash order
    for t in usable:
        conversations.setdefault(t.trajectory_id, []).append(t)
    strata = sorted(s for s, count in profile.items() if count > 0)
    # A busy agent's traffic brings more conversations than the engine can pair (users
    # first: the test samples in what they leave): one turn a pair. A quiet one's brings
    # fewer: each conversation gives up to TURNS_PER_DRAW turns' evidence. Either way a
    # pair's expected difference is the day's mean over the turns served, and the choice
    # reads what the source holds, never an outcome, so the e-process keeps its level.
    per_draw = 1 if len(conversations) >= PLENTY * n else TURNS_PER_DRAW
    rng, out, used = random.Random(seed), [], set()
    while len(used) < n and strata:
        stratum = rng.choices(strata, weights=[profile[s] for s in strata])[0]
        queue = queues.get(stratum, [])
        while queue and queue[0].trajectory_id in used:
            queue.pop(0)
        if not queue:  # its turns not drawn yet are all ones the test may not use
            return out, stratum
        turn = queue.pop(0)
        out.extend(_unit(turn, conversations[turn.trajectory_id], per_draw))
        used.add(turn.trajectory_id)
    return out, None


def _unit(turn: Turn, turns: list[Turn], most: int) -> list[Turn]:
    """The turns one draw takes from the conversation of `turn` (the one it drew): that
    turn and its conversation's other usable turns in the test's hash order, at most
    `most` in all. The pair is their mean difference (`pairs`): every turn of a
    conversation of up to that many, else the drawn one and a random few of the rest,
    whose mean is the conversation's own, expected."""
    rest = [t for t in turns if t.id != turn.id]
    return [turn, *rest[: most - 1]]


def pairs_made(store, tests) -> int:
    """How many pairs `tests` made so far (a resumed round goes on from there)."""
    return store.scalar(
        "SELECT count(*) AS n FROM groups WHERE kind = 'ab' AND list_contains(?::VARCHAR[], test)",
        [list(tests)],
    )
