"""`onjob serve`: the proxy and the collector's writer in one asyncio process; with
`--workers N`, N - 1 proxy-only processes beside it (N with `--loader-apart`, and this one
answers none: `workers.py`); with `--primary URL`, a proxy-only process itself."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from urllib.parse import urlsplit

import httpx
import uvicorn

from .. import bundled, dashboard
from ..collector import Collector, Store
from ..deploy import admin
from ..deploy.act.engine import engine_client
from ..deploy.act.operator import Operator
from ..deploy.decide.trust import static_mode
from ..deploy.loop import PeriodicLoop
from ..deploy.metrics import LoopReadings
from ..judge import NO_SCORER, rewards
from ..proxy import (
    ProxySettings,
    Router,
    Upstream,
    create_app,
    replicas,
)
from ..proxy.lean import LeanUpstream
from ..proxy.metrics import Metrics
from ..proxy.pool import Pool, Replica
from . import admin_key, deadlines
from .common import local_url
from .exits import Failed, Refused
from .process import EngineProcess, must_be_free
from .settings import ServeSettings
from .stopping import Interrupted, Server, Signals
from .supervisor import Eta, Supervisor
from .telemetry import tracer
from .workers import Workers, listening_socket, worker_argv

log = logging.getLogger("onjob.serve")


def build_upstream(p: ProxySettings, url: str | None = None) -> Upstream:
    return LeanUpstream(
        url or p.engine_url,
        connect_timeout=p.connect_timeout_s,
        read_timeout=p.read_timeout_s,
        answer_timeout=p.answer_timeout_s,
        max_answer_bytes=p.max_answer_bytes,
        max_connections=p.max_connections,
    )


def build_pool(settings: ServeSettings, judge_engine: httpx.AsyncClient) -> Pool:
    """One replica per engine URL, each with its own control client (the judge's engine
    shares the judge's)."""
    p = settings.proxy
    replicas = []
    for url in p.replica_urls:
        control = judge_engine if url == p.engine_url else engine_client(settings, url)
        replicas.append(Replica(url, build_upstream(p, url), control, logprobs=p.engine_logprobs))
    return Pool(replicas, interval_s=p.health_interval_s, resolves=p.engines_resolve_adapters)


def build_app(settings: ServeSettings, workers: Workers | None = None, eta: Eta | None = None):
    """The server's app; `workers` (its proxy-only processes) stop before the collector's
    last load, so what they spooled is in the database when it exits; `eta`: when the
    engine child being restarted should serve again (`--start-engine`)."""
    if settings.proxy.primary_url:
        return build_proxy_app(settings)
    collector = Collector(settings.collector)
    engine = engine_client(settings)
    pool = build_pool(settings, engine)
    if eta is not None:
        pool.restart_eta = eta.back_in
    router = Router.from_settings(settings.proxy, pool)
    pool.wanted = router.adapters
    operator = Operator(collector, router, engine, settings.proxy.aliases, pool=pool)
    loop = PeriodicLoop(collector, operator, settings)
    metrics = Metrics()  # `GET /metrics`: this process's exchanges, and the loop's stage
    metrics.watch(LoopReadings(loop))

    spool = settings.collector.spool

    async def stop_workers() -> None:
        await asyncio.to_thread(workers.stop, settings.proxy.shutdown_grace_s + 10)

    async def routing_from_database() -> None:
        try:
            await operator.restore()
        except Exception as exc:  # serve anyway: the proxy's errors will say what is missing
            log.error("could not restore routing from the deployments table: %s", exc)
        # Proxy-only processes (`--workers`, `--primary`) route as this one does.
        replicas.publish(router, spool)

    async def restore_routing() -> None:
        await routing_from_database()
        router.listeners.append(lambda: replicas.publish(router, spool))

    # A standby that takes over with the old loader's database routes as it did.
    collector.on_takeover.append(routing_from_database)
    following: list[asyncio.Task] = []

    async def follow_the_routing() -> None:
        """With a DuckLake: route as the `deployments` rows say, whichever server's worker
        decided (each lineage's decisions are the worker's that holds it)."""
        if settings.collector.catalog is not None:
            following.append(asyncio.create_task(_follow_routing(collector, operator)))

    async def stop_following() -> None:
        for task in following:
            task.cancel()

    return create_app(
        settings.proxy,
        upstream=pool,
        collector=collector,
        tracer=tracer(settings.telemetry),
        router=router,
        routes=[
            *admin.routes(settings, collector, router, operator, loop),
            *dashboard.routes(settings, collector, router, loop, operator),
        ],
        on_startup=[restore_routing, follow_the_routing, loop.start, settle_gc],
        # The pool closes every engine client, the judge's too.
        on_shutdown=[*([stop_workers] if workers else []), stop_following, loop.stop, unfreeze_gc],
        metrics=metrics,
    )


FOLLOW_S = 2.0  # how often a DuckLake's server reads the routing other workers decided


async def _follow_routing(collector: Collector, operator: Operator) -> None:
    while True:
        await asyncio.sleep(FOLLOW_S)
        if collector.outage.since is not None:
            continue  # the catalog does not answer (the loader says so)
        try:
            await operator.follow()
        except Exception as exc:  # the next round reads again
            log.error("could not follow the routing in the lake: %s", exc)


def build_proxy_app(settings: ServeSettings):
    """A proxy-only process: the OpenAI routes, the shared spool, the primary's routing; the
    rest forwarded to the primary."""
    collector = Collector(settings.collector, load=False)
    pool = build_pool(settings, engine_client(settings))
    router = Router.from_settings(settings.proxy, pool)
    pool.wanted = router.adapters
    spool = settings.collector.spool
    following: list[asyncio.Task] = []

    async def follow() -> None:
        replicas.apply(router, spool)
        following.append(asyncio.create_task(replicas.follow(router, spool)))

    async def stop_following() -> None:
        for task in following:
            task.cancel()

    return create_app(
        settings.proxy,
        upstream=pool,
        collector=collector,
        tracer=tracer(settings.telemetry),
        router=router,
        on_startup=[follow, settle_gc],
        on_shutdown=[stop_following, unfreeze_gc],
        forward=replicas.Forwarder(
            settings.proxy.primary_url,
            timeout_s=settings.proxy.read_timeout_s,
            follow=lambda: collector.loader_url,
        ),
    )


# Python's cyclic GC, tuned for a server that allocates a few hundred short-lived containers
# per request and keeps a large, slowly changing heap (modules, the stitcher's memory). With
# the defaults (700, 10, 10) a full collection ran every ~0.6 s under load at c64, each
# 70-230 ms (it walks every tracked object): that was the proxy's p99. Objects alive at
# start-up are frozen out of collections; young collections run every 20,000 allocations
# instead of 700 (fewer passes over the requests in flight, ~15% of the CPU per request);
# full collections are rare but still happen (cyclic garbage is still freed).
GC_THRESHOLDS = (20_000, 50, 100)


async def settle_gc() -> None:
    """Once started (the stitcher warmed from the database): freeze what is alive, so no
    collection walks it again, and set `GC_THRESHOLDS`."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def unfreeze_gc() -> None:
    """At shutdown: what `settle_gc` froze is collectable again. Frozen objects are never
    collected, not even when the interpreter exits, so reference cycles among them kept
    DuckDB's module alive past its teardown (its binding printed ~40 lines of "nanobind:
    leaked instances" at every exit)."""
    gc.unfreeze()


def log_to_stderr() -> None:
    """onjob's own log lines (judge passes, replayed spools) on stderr; libraries stay quiet."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
    logger = logging.getLogger("onjob")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def with_admin_key(settings: ServeSettings) -> ServeSettings:
    """`settings` with the admin key in force: proxy.admin_key, else the one kept beside the
    database (`admin_key.py`), made by the primary at its first start and said once on
    stderr; a proxy-only process reads it (for `X-Onjob-Arm`) and never makes one."""
    p = settings.proxy
    if p.admin_key:
        return settings
    db = settings.collector.db
    try:
        if p.primary_url:
            key, made = admin_key.read(db), False
        else:
            key, made = admin_key.ensure(db)
    except admin_key.KeyFileError as exc:
        raise Refused(str(exc)) from exc
    if key is None:
        return settings
    if made:
        print(
            f"onjob serve: made an admin key for the admin API and the dashboard (shown this "
            f"once; kept in {admin_key.path_for(db)}, mode 0600, where `onjob status` and the "
            f"other commands read it): {key}",
            file=sys.stderr,
            flush=True,
        )
    return settings.model_copy(update={"proxy": p.model_copy(update={"admin_key": key})})


def serve(settings: ServeSettings, argv: list[str] | None = None) -> None:
    """Serve until SIGTERM or SIGINT (`stopping.py` says how it stops). `argv`: this
    command's arguments, which `--workers` starts its workers with."""
    # The port first: taken, it is one clear line, before a database or a key is made.
    sockets, workers = _sockets(settings.proxy, argv)
    if settings.engine.start:  # the engine's port too, before a database or a key is made
        must_be_free(_engine_port(settings.proxy), "engine")
    if not settings.proxy.primary_url:
        # Open (and migrate) the database once up front: a locked or unreadable file is a
        # clear error here rather than a failed start-up hook inside uvicorn.
        Store.open(settings.collector, follow=True).close()
        # A reward function that does not import (a misspelt module, run from another
        # directory) is one clear line here, not a loop that fails every iteration.
        rewards.load({**settings.judge.rewards, **settings.loop.gate.rewards})
    configured_key = settings.proxy.admin_key is not None
    settings = with_admin_key(settings)
    p = settings.proxy  # the settings in force (what the app is built with)
    log_to_stderr()
    if settings.engine.start and p.engine_token is None:
        # The child's adapter routes answer onjob alone, not every local process: this
        # server, and the commands that find the token beside the database (`onjob doctor`,
        # `onjob loop`, `onjob compare`).
        try:
            token, _ = admin_key.ensure(settings.collector.db, admin_key.ENGINE_TOKEN)
        except admin_key.KeyFileError as exc:
            raise Refused(str(exc)) from exc
        p = p.model_copy(update={"engine_token": token})
        settings = settings.model_copy(update={"proxy": p})
    eta = Eta() if settings.engine.start else None
    app = build_app(settings, workers, eta)
    supervisor, gave_up = None, []
    with Signals().installed() as signals:

        def give_up(why: str) -> None:
            gave_up.append(why)
            log.error("%s", why)
            if signals.server is not None:
                signals.server.should_exit = True

        try:
            if settings.engine.start:
                began = time.monotonic()
                signals.engine = _start_engine(settings)
                eta.start_s = time.monotonic() - began  # a restart's first estimate
                supervisor = Supervisor(
                    signals.engine,
                    restarts=settings.engine.restarts,
                    window_s=settings.engine.restart_window_s,
                    give_up=give_up,
                    eta=eta,
                ).start()
            _say_started(settings, configured_key)
            config = uvicorn.Config(
                app,
                host=p.host,
                port=p.port,
                log_level="warning",
                access_log=False,
                timeout_graceful_shutdown=p.shutdown_grace_s,
                http=deadlines.protocol(p.header_timeout_s, p.body_timeout_s),
                limit_concurrency=p.max_client_connections,
            )
            signals.server = Server(config)
            signals.server.should_exit = bool(gave_up)  # the child died before this
            if workers is not None:
                workers.start()
            signals.server.run(sockets=sockets)
        except Interrupted:
            pass  # before serving: nothing in flight
        finally:
            if workers is not None:
                workers.stop(timeout=p.shutdown_grace_s + 10)
            if supervisor is not None:
                supervisor.stop()
            if signals.engine is not None:
                signals.engine.stop()
    if gave_up:
        raise Failed(gave_up[0])


def _sockets(p, argv: list[str] | None) -> tuple[list, Workers | None]:
    """The sockets this process serves. Several processes on one port: each binds it with
    SO_REUSEPORT. The primary also listens on a loopback port of its own, where its workers
    forward what needs it; with `loader_apart`, on that one alone."""
    apart = p.loader_apart and not p.primary_url
    started = p.workers if apart else p.workers - 1  # proxy-only workers this one starts
    workers = None
    try:
        public = listening_socket(p.host, p.port, reuse_port=bool(p.primary_url or started))
    except OSError as exc:
        raise Refused(
            f"cannot listen on {p.host}:{p.port}: {exc.strerror or exc} (another server on "
            "it? stop that one, or choose another port with --port or [proxy] port)"
        ) from exc
    if apart:
        # Bound only to fail here, clearly, when the port is taken: a socket kept in the
        # port's group without being served would be handed connections no one accepts.
        public.close()
    sockets = [] if apart else [public]
    if started and not p.primary_url:
        internal = listening_socket("127.0.0.1", 0, reuse_port=False)
        sockets.append(internal)
        url = f"http://127.0.0.1:{internal.getsockname()[1]}"
        workers = Workers(worker_argv(argv or ["serve"], url), started)
    return sockets, workers


def _engine_port(p) -> int:
    """The port `--start-engine` starts its child on: `proxy.engine_url`'s."""
    return urlsplit(p.engine_url).port or 8001


def _start_engine(settings: ServeSettings) -> EngineProcess:
    p = settings.proxy
    port = _engine_port(p)
    print(f"onjob serve: starting `onjob engine` on port {port}...", file=sys.stderr)
    args = settings.engine.args
    model = args[args.index("--model") + 1] if "--model" in args[:-1] else None
    if bundled.names_bundled(model) and not bundled.is_prepared(bundled.prepared_path()):
        # The engine converts it, in its own log: said here, or a first start is silent
        # for the ~40 s it takes.
        print(
            "onjob serve: first start: the engine converts the bundled model once (about "
            "30-40 s here); later starts take seconds",
            file=sys.stderr,
        )
    # Started from this, the main, thread: it dies with this process even on SIGKILL
    # (`process._die_with_parent`).
    engine = EngineProcess(
        settings.engine.args,
        port=port,
        timeout=900,
        new_session=True,
        env={"ONJOB_ENGINE_ADAPTER_TOKEN": p.engine_token},
        die_with_parent=True,
    )
    engine.start()
    return engine


def _log_at(c) -> str:
    """Where the log goes, as the start-up line says it (a catalog's password left out)."""
    if c.catalog is None:
        return str(c.db)
    from ..collector.lake import shown

    return f"the DuckLake of {shown(c.catalog)} (data in {c.data_path})"


def _say_started(settings: ServeSettings, configured_key: bool) -> None:
    """The start-up line on stderr: where it listens, what it logs to, what is open."""
    p = settings.proxy
    apart = p.loader_apart and not p.primary_url
    role = (
        f"proxy only, for {p.primary_url}; spool {settings.collector.spool}"
        if p.primary_url
        else f"logging to {_log_at(settings.collector)}"
        + (f"; {p.workers} worker{'s' * (p.workers > 1)}" if p.workers > 1 or apart else "")
        + ("; this process answers none (--loader-apart)" if apart else "")
    )
    print(
        f"onjob serve: http://{p.host}:{p.port}/v1 -> engine {', '.join(p.replica_urls)}; "
        f"{role}; models: {', '.join(p.aliases)}"
        + (
            ""
            if p.api_keys
            else " (no API keys: any local process may use the models and write to "
            "the log; set proxy.api_keys to close them)"
        )
        + (
            ""
            if configured_key or p.primary_url
            else f"; admin key in {admin_key.path_for(settings.collector.db)}"
        )
        + (
            f"; loop every {settings.loop.interval_s:g} s"
            if settings.loop.interval_s > 0 and not p.primary_url
            else "; loop off"
        ),
        file=sys.stderr,
        flush=True,
    )
    if not p.primary_url:
        print(
            f"onjob serve: dashboard at {local_url(p)}/dashboard (its password: the admin key)",
            file=sys.stderr,
            flush=True,
        )
    if not p.primary_url and settings.loop.train and settings.loop.interval_s > 0:
        print(
            f"onjob serve: release mode {static_mode(settings).reason}",
            file=sys.stderr,
            flush=True,
        )
        if settings.judge.scorer() is None:
            print(f"onjob serve: {NO_SCORER}", file=sys.stderr, flush=True)
