"""`onjob compare A B`: an offline paired A/B of two checkpoints on logged prompts.

For each chosen prompt (recent logged turns, optionally of one scenario, or the
requests in a JSONL file), both checkpoints answer the same request; the answers
form one `ab` group, judged together (RULER, reward functions), so the judge
compares like with like. Each pair is a win, tie or loss for B; the result is B's
win rate with a 95% Wilson interval, per scenario and overall. Live routing is
not touched.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import msgspec

from ..collector import Collector, rebuilt
from ..collector.ids import new_id
from ..collector.scope import KeyScope
from ..judge import rewards, sampling
from ..judge.tables import LOGGED_TURN, LoggedTurn
from ..proxy.tenants import Tenants
from .act import adapters, registry
from .act.engine import engine_client
from .decide import stats
from .decide.evidence import Tally
from .decide.pairs import Missing, ab_outcomes, paired_round
from .decide.prompts import TRAINED_CONVERSATIONS
from .errors import NothingToJudge, UnknownCheckpoint
from .settings import DeploySettings

BASE = ("base", "")


async def compare(
    settings: DeploySettings,
    a: str,
    b: str,
    *,
    prompts: int = 20,
    scenario: str | None = None,
    file: Path | None = None,
    samples: int = 1,
    tenant: str | None = None,
    echo=print,
) -> Comparison:
    """`tenant`: logged prompts of its keys alone (none: of every key but
    `proxy.untrained_keys`)."""
    started = time.perf_counter()
    s = settings.judge.model_copy(update={"group_size": samples})
    fns = rewards.load(s.rewards)
    if not s.scorers:
        raise NothingToJudge("nothing to judge with: set judge.model (RULER) or [judge.rewards]")
    db = Collector(settings.collector)
    await db.start()
    try:
        async with engine_client(settings) as engine:
            base = await sampling.base_model(engine)
            models = {
                arm: await _ensure_loaded(db, engine, name, base)
                for arm, name in (("a", a), ("b", b))
            }
            trained = [name for name in (a, b) if name not in BASE and name != base]
            tenants = Tenants.of(settings.proxy)
            tenants.routed(settings.loop.alias, tenant)  # an unknown tenant refused by name
            scope = (
                tenants.lineage(settings.loop.alias, tenant).scope
                if tenant
                else KeyScope(None, tenants.untrained)
            )
            chosen = await _prompts(db, prompts, scenario, file, trained, scope)
            echo(
                f"comparing {a} (A) and {b} (B) on {len(chosen)} prompts, {samples} answer(s) each"
            )
            test = new_id("compare:")
            groups = await paired_round(db, engine, s, fns, chosen, models, test=test, echo=echo)
            by_scenario, failed = await db.query(
                lambda st: ab_outcomes(
                    st, "list_contains(?, g.id)", [groups], missing_is_loss=False
                )
            )
    finally:
        await db.close()
    everything = [o for outs in by_scenario.values() for o in outs]
    return Comparison(
        a=a,
        b=b,
        judge=s.scorers,
        seconds=time.perf_counter() - started,
        overall=Tally.of(stats.tally(everything)),
        scenarios={k: Tally.of(stats.tally(v)) for k, v in sorted(by_scenario.items())},
        failed=failed,
    )


async def _ensure_loaded(db: Collector, engine: httpx.AsyncClient, name: str, base: str):
    """(engine model id, checkpoint) for a name; an adapter from the registry is loaded into
    the engine if it is not there yet."""
    if name in BASE or name == base:
        return base, None
    row = await db.query(lambda st: registry.get(st, name))
    if row is not None:
        await adapters.ensure_loaded(engine, name, row.path)
    elif name not in await adapters.loaded(engine):
        raise UnknownCheckpoint(f"{name!r} is neither in the engine nor in the checkpoints table")
    return name, name


async def _prompts(
    db: Collector,
    n: int,
    scenario: str | None,
    file: Path | None,
    trained: list[str],
    scope: KeyScope,
) -> list[LoggedTurn]:
    """The file's requests; or recent production turns (of one scenario), one per
    conversation, in no conversation either checkpoint's lineage trained on, of the keys in
    `scope`."""
    if file is not None:
        out = [
            _from_file(file, json.loads(line))
            for line in file.read_text().splitlines()
            if line.strip()
        ]
        return out[:n] if n else out
    mine, keys = scope.sql("e.api_key_id")
    ids = (
        "SELECT e.id, e.ts FROM exchanges e JOIN scenarios s ON s.id = e.scenario_id "
        f"WHERE e.status < 400 AND e.source = 'production' AND {mine} "
        f"AND e.trajectory_id NOT IN ({TRAINED_CONVERSATIONS}) "
        + ("AND (s.key = ? OR s.id = ?) " if scenario else "")
        + "QUALIFY row_number() OVER (PARTITION BY e.trajectory_id ORDER BY e.ts DESC) = 1 "
        + "ORDER BY e.ts DESC LIMIT ?"
    )
    sql = f"SELECT {LOGGED_TURN} FROM {rebuilt(ids)} e ORDER BY e.ts DESC"
    params = [*keys, trained] + ([scenario, scenario, n] if scenario else [n])
    return await db.query(lambda st: st.rows(LoggedTurn, sql, params))


def _from_file(file: Path, request: dict) -> LoggedTurn:
    """A request of the file as a prompt never logged: no exchange, a conversation of its
    own (each pair its own seed), the file as its scenario."""
    return LoggedTurn(
        id=None,
        trajectory_id=new_id("compare-"),
        turn=0,
        scenario_id=f"file:{file.name}",
        api_key_id=None,
        model_alias=None,
        checkpoint=None,
        arm=None,
        request=json.dumps({"model": "-", **request}),
        response=None,
        prompt_token_ids=None,
    )


class Comparison(msgspec.Struct, kw_only=True):
    """`onjob compare`'s answer: B's pairs against A's, overall and per scenario, and the
    pairs that could not be judged (B's failures are among the losses)."""

    a: str
    b: str
    judge: list[str]
    seconds: float
    overall: Tally
    scenarios: dict[str, Tally]
    failed: list[Missing]


def render(result: Comparison) -> str:
    lines = [
        f"B = {result.b} against A = {result.a}, judged by {', '.join(result.judge)}",
        f"{'scenario':<32} {'pairs':>5} {'B wins':>6} {'ties':>5} {'A wins':>6}  "
        "B win rate [95% CI]",
    ]
    for name, r in [*result.scenarios.items(), ("overall", result.overall)]:
        low, high = r.ci95
        rate = "–" if r.win_rate is None else f"{r.win_rate:.2f}"
        lines.append(
            f"{name[:32]:<32} {r.pairs:>5} {r.wins:>6} {r.ties:>5} {r.losses:>6}  "
            f"{rate} [{low:.2f}, {high:.2f}]"
        )
    if result.failed:
        lines.append(f"{len(result.failed)} pairs could not be judged: {result.failed[0].reason}")
    lines.append(f"({result.seconds:.1f} s)")
    return "\n".join(lines)
