"""`onjob checkpoints`, `compare`, `canary`, `promote`, `rollback` and `status`: what is
served, and the changes to it."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

import msgspec

from .common import CONFIG, DATABASE, ENGINE, SERVER, ask_admin, load_settings, offline
from .exits import Exit, Failed, Refused

if TYPE_CHECKING:
    from ..deploy.act.reviews import ReleaseStatus
    from ..deploy.records import Routing


def cmd_checkpoints(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .. import bundled
    from ..collector import StorageError, Store
    from ..deploy.act import registry

    settings = load_settings(args, collector={"db": args.db})
    if args.action == "add" and not (args.path and args.name):
        raise Refused("add: give PATH and --name")
    try:
        store = Store.open(settings.collector)
    except StorageError as exc:
        raise Refused(str(exc)) from exc
    try:
        if args.action == "add":
            base = Path(args.base_model or settings.trainer.base_model or bundled.resolve(None))
            row = registry.add(store, Path(args.path), args.name, base)
            print(f"{row.name}: imported as a candidate ({row.path})")
            return Exit.OK
        rows = registry.checkpoints(store)
    except registry.RegistryError as exc:
        raise Refused(str(exc)) from exc
    finally:
        store.close()
    if not rows:
        print("no checkpoints yet: `onjob train` writes them, `onjob checkpoints add` imports")
    for r in rows:
        created = r.created.strftime("%Y-%m-%d %H:%M") if r.created else ""
        print(f"{r.name:<40} {r.status:<10} {created:<17} parent={r.parent or '-'}")
    return Exit.OK


def cmd_compare(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from ..collector import StorageError
    from ..deploy.compare import compare, render
    from ..deploy.errors import DeployError
    from ..judge import ConfigError, JudgeError

    settings = load_settings(
        args,
        proxy={"engine_url": args.engine_url},
        collector={"db": args.db},
        judge={"model": args.model, "api_base": args.api_base},
    )
    try:
        result = asyncio.run(
            compare(
                settings,
                args.a,
                args.b,
                prompts=args.prompts,
                scenario=args.scenario,
                file=Path(args.file) if args.file else None,
                samples=args.samples,
                tenant=args.tenant,
                echo=(lambda line: print(line, file=sys.stderr)) if args.json else print,
            )
        )
    except (StorageError, ConfigError, DeployError, ValueError) as exc:
        raise Refused(str(exc)) from exc
    except JudgeError as exc:  # the judge failed while the comparison ran
        raise Failed(str(exc)) from exc
    print(
        msgspec.json.format(msgspec.json.encode(result)).decode() if args.json else render(result)
    )
    return Exit.OK


def _show_route(row: Routing, online: bool) -> None:
    canary = f", canary {row.canary} ({row.fraction:.0%})" if row.canary else ""
    print(f"{row.model_alias}: live {row.live or 'base'}{canary}")
    if not online:
        print("(no server answered: recorded in the database; `onjob serve` routes so at start)")


def cmd_route(args: argparse.Namespace) -> int:
    from ..deploy.act import deployments
    from ..proxy.tenants import Tenants, UnknownTenant

    command = args.command
    said = {"alias": args.alias, "reason": args.reason, "tenant": args.tenant}
    settings = load_settings(args, collector={"db": args.db})
    try:  # the tenant checked here too: with no server, the change is recorded offline
        lineage = Tenants.of(settings.proxy).routed(args.alias, args.tenant)
    except UnknownTenant as exc:
        raise Refused(str(exc)) from exc

    def change(client) -> Routing:
        if command == "canary":
            return client.canary(args.checkpoint, fraction=args.fraction, **said)
        return getattr(client, command)(**said)

    row = ask_admin(args, settings, change, timeout=300)
    online = row is not None
    if not online:
        default = settings.proxy.aliases.get(args.alias)
        common = {"default_live": default, "reason": args.reason, "actor": "cli"}
        if command == "canary":
            row = offline(
                settings,
                lambda st: deployments.set_canary(
                    st, lineage, args.checkpoint, args.fraction, **common
                ),
            )
        else:
            fn = getattr(deployments, command)
            row = offline(settings, lambda st: fn(st, lineage, **common))
    _show_route(row, online)
    return Exit.OK


def cmd_status(args: argparse.Namespace) -> int:
    from ..deploy.act import deployments, registry, reviews
    from ..deploy.decide import fair, fit
    from ..judge import NO_SCORER, judge_agreement
    from ..proxy.tenants import Tenants

    settings = load_settings(args, collector={"db": args.db})
    status = ask_admin(args, settings, lambda client: client.status(), timeout=30)
    if status is None:

        def read(st):
            return (
                deployments.routes(st, Tenants.of(settings.proxy).defaults(settings.proxy.aliases)),
                registry.checkpoints(st),
                deployments.history(st, 10),
                judge_agreement(st),
                reviews.status(st, settings),
                fit.current(st, settings),
                {t: share.state() for t, share in fair.shares(st, settings).items()},
            )

        aliases, ckpts, history, agreement, release, fitted, shares = offline(settings, read)
        print("no server answered; from the database:")
    else:
        shares = status.loop.tenant_budgets
        aliases, history = status.aliases, status.deployments
        agreement = status.judge_agreement
        release, fitted, ckpts = status.release, status.fitted, None
    if release:
        _show_release(release)
    if status is not None and status.collector.loader:  # hosts sharing a bucket or a lake
        c = status.collector
        if c.lake:
            print(f"loader: {c.loader}")
        else:
            hosts = ", ".join(c.hosts_live) or "none"
            dropped = ", ".join(c.hosts_dropped)
            print(
                f"loader: {c.loader}; hosts live: {hosts}"
                + (f"; past their lease (taken for dead): {dropped}" if dropped else "")
            )
    if status is not None:
        print(f"loop: {status.loop.line(time.time())}")
    scorer = status.loop.scorer if status is not None else settings.judge.scorer()
    if scorer is None and settings.loop.train:
        print(f"NO SCORER: {NO_SCORER}")
    if fitted:
        print(f"loop settings: {fitted.line}")
    tenants = Tenants.of(settings.proxy)
    lineages = status.loop.lineages if status else {}
    last = {h.model_alias: h for h in reversed(history)}  # each lineage's newest change
    for alias, a in aliases.items():
        canary = f", canary {a.canary} ({a.fraction:.0%})" if a.canary else ""
        line = f"{alias}: live {a.live or 'base'}{canary}"
        if tenants.keys:  # who each lineage serves, what it waits on, its last decision
            lineage = tenants.named(alias)
            whose = (
                f"tenant {lineage.tenant}: {', '.join(tenants.keys[lineage.tenant])}"
                if lineage.tenant
                else "shared: every key no tenant holds"
            )
            line += f"  [{whose}]"
            if alias in last:
                line += f"; last: {(last[alias].reason or '')[:80]} ({last[alias].actor})"
        state = lineages.get(alias)
        if state is not None and state.worker:  # a lake's lineage another worker holds now
            line += f"\n  worked by: {state.worker} (another server's worker; ask it)"
        elif state is not None:  # what its next run and decision wait for, and the signal
            line += f"\n  groups ready to train: {state.ready_groups} of {state.wanted_groups}"
            if state.waiting:
                line += f"\n  training: {state.waiting}"
            if state.deciding:
                line += f"\n  deciding: {state.deciding}"
            if state.signal is not None:
                line += f"\n  signal: {state.signal.line}"
        print(line)
    for tenant, share in shares.items():  # each tenant's share of the trainer and judge
        said = [b.status for b in (share.train, share.judge) if b is not None]
        if said:
            print(f"tenant {tenant}: " + "; ".join(said))
    for h in history[:10]:
        print(
            f"  {h.ts}  {h.model_alias}: live={h.live or 'base'} "
            f"canary={h.canary or '-'}  {h.reason} ({h.actor})"
        )
    if ckpts is not None:
        print(f"{len(ckpts)} checkpoints: " + ", ".join(f"{c.name} ({c.status})" for c in ckpts))
    _show_agreement(agreement)
    return Exit.OK


def _show_release(release: ReleaseStatus) -> None:
    """The release mode, then each canary ready for review with its evidence: what a
    person reads before `onjob promote` or `onjob rollback`."""
    from ..collector.scope import lineage_flags

    print(f"release mode {release.mode.reason}")
    for alias, r in release.reviews.items():
        e = r.evidence or {}  # as stored: a review may be older than today's evidence types
        paired = e.get("paired") or {}
        print(f"READY FOR REVIEW {alias}: canary {r.checkpoint} since {r.ts}: {r.reason}")
        if paired:
            print(
                f"  pairs: {paired.get('wins')} wins, {paired.get('ties')} ties, "
                f"{paired.get('losses')} losses of {paired.get('pairs')} "
                f"(win rate {paired.get('win_rate') or 0:.2f}; unjudged "
                f"{e.get('unjudged_pairs', 0)}), judged by {', '.join(e.get('referee') or [])}"
            )
        for name, guard in (e.get("shape") or {}).items():
            if isinstance(guard, dict):
                said = guard.get("tripped") or guard.get("holding") or "clear"
                print(f"  guard {name}: {said}")
        which = lineage_flags(alias)
        print(f"  decide: onjob promote {which}  or  onjob rollback {which}")


def _show_agreement(records) -> None:
    """One line per judge over all scenarios; a WARNING line for a judge, or a scenario of
    it, that orders answers no better than chance against users' feedback."""
    for a in records:
        if a.scenario_id is None:
            print(f"judge {a.summary()}")
        if a.warning:
            where = f" in scenario {a.scenario}" if a.scenario_id else ""
            where += f" (users' {a.metric})" if a.metric else ""
            print(
                f"WARNING: judge {a.judge}{where} {_WARNED[a.verdict]} users' feedback "
                f"({a.agreed:g} of {a.pairs} pairs): its rewards may not be what users want"
            )


_WARNED = {"chance": "does no better than chance against", "disagrees": "orders answers against"}


def add_commands(sub) -> None:
    _add_checkpoints(sub)
    _add_compare(sub)
    _add_routing(sub)
    status = sub.add_parser(
        "status",
        help="routing per alias, the latest deployments, each judge's agreement with feedback",
        parents=[SERVER, CONFIG, DATABASE],
    )
    status.set_defaults(func=cmd_status)


def _add_checkpoints(sub) -> None:
    ckpts = sub.add_parser(
        "checkpoints",
        help="list checkpoints, or import an adapter trained elsewhere",
        description=(
            "`onjob checkpoints` lists the registry (name, status candidate/canary/review/"
            "live/retired/stranded, created, parent). `onjob checkpoints add PATH --name "
            "NAME` imports a PEFT LoRA directory as a candidate after checking its shapes "
            "against the base model."
        ),
        parents=[CONFIG, DATABASE],
    )
    ckpts.add_argument("action", nargs="?", choices=["list", "add"], default="list")
    ckpts.add_argument("path", nargs="?", help="with add: the adapter directory")
    ckpts.add_argument("--name", help="with add: the checkpoint's name")
    ckpts.add_argument("--base-model", help="with add: the base model directory to check against")
    ckpts.set_defaults(func=cmd_checkpoints)


def _add_compare(sub) -> None:
    cmp = sub.add_parser(
        "compare",
        help="offline paired A/B of two checkpoints on logged prompts",
        description=(
            "Both checkpoints answer the same prompts (recent logged turns, one scenario's, or "
            "the chat requests in a JSONL file); each pair is judged together (RULER and/or "
            "[judge.rewards]); prints B's win rate against A with a 95% Wilson interval, per "
            "scenario and overall. `base` names the base model; registry checkpoints are "
            "loaded into the engine if needed. Live routing is not touched."
        ),
        parents=[CONFIG, DATABASE, ENGINE],
    )
    cmp.add_argument("a", help="the baseline checkpoint (or `base`)")
    cmp.add_argument("b", help="the challenger checkpoint (or `base`)")
    cmp.add_argument("--prompts", type=int, default=20, help="how many prompts (20)")
    cmp.add_argument("--scenario", help="only this scenario (key or id)")
    cmp.add_argument("--file", help="JSONL of chat requests ({messages, tools, ...}) instead")
    cmp.add_argument("--samples", type=int, default=1, help="answers per checkpoint per prompt")
    cmp.add_argument("--tenant", help="only prompts of this tenant's keys (proxy.tenants)")
    cmp.add_argument("--json", action="store_true", help="print the result as JSON")
    cmp.add_argument("--model", help="RULER judge (litellm model name)")
    cmp.add_argument("--api-base", help="the judge's OpenAI-compatible base URL")
    cmp.set_defaults(func=cmd_compare)


def _add_routing(sub) -> None:
    """canary, promote, rollback: the routing changes a person makes."""
    routing = argparse.ArgumentParser(add_help=False, parents=[SERVER, CONFIG, DATABASE])
    routing.add_argument("--reason", default="by hand", help="recorded with the change")
    routing.add_argument(
        "--tenant",
        help="the tenant's lineage of ALIAS (a name in proxy.tenants; default: the shared one, "
        "which serves every key no tenant holds)",
    )

    about = (
        "Asks the running `onjob serve` (admin API, proxy.admin_key) so it takes effect at "
        "once; with no server running, records it in the database for the next start. "
        "Every change is a `deployments` row with its reason."
    )
    canary = sub.add_parser(
        "canary",
        help="serve a checkpoint to a fraction of an alias",
        description="Put CHECKPOINT behind ALIAS as its canary. " + about,
        parents=[routing],
    )
    canary.add_argument("alias")
    canary.add_argument("checkpoint")
    canary.add_argument("--fraction", type=float, default=0.1, help="of conversations (0.1)")
    canary.set_defaults(func=cmd_route)
    for name, text in (
        ("promote", "make an alias's canary its live checkpoint"),
        ("rollback", "retire an alias's canary"),
    ):
        p = sub.add_parser(
            name,
            help=text,
            description=f"{text[0].upper()}{text[1:]}. {about}",
            parents=[routing],
        )
        p.add_argument("alias")
        p.set_defaults(func=cmd_route)
