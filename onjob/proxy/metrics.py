"""`GET /metrics`: the server's counters and gauges in Prometheus' text format.

Two kinds, in one registry of the app's own (never `prometheus_client`'s global one, so
two apps in one process, as in the tests, count apart):

- counted as each exchange finishes, where its spool line is written (`Traffic.finish`):
  `onjob_requests_total{alias,arm,status}` and `onjob_request_duration_seconds{alias,arm}`,
  the latency the log records for it. `alias` is the lineage (`alias`, or `alias@tenant`
  with tenants), as the deployments log names it. An exchange is one attempt: a canary
  that failed and was answered by live counts twice, once per arm, as the log and the
  canary's guards count it; a request refused before it was routed (a malformed body, a
  wrong key) is no exchange and is not counted;
- read at each scrape: the engines (`Pool`), the routing (`Router`), the collector's
  counters (`CollectorStats`), and what the server adds with `Metrics.watch` (the loop's
  stage: `deploy/metrics.py`).

Each process counts its own exchanges. A proxy-only process counts none and forwards
`/metrics` to the primary (`app._forwarded`), so a scrape through a port shared by
`--workers` always reads the primary's series: its own exchanges, the engines as it sees
them, and the loop, routing and spool, which are the whole server's (docs/metrics.md).

Behind its own door (`auth.Doors.metrics_guard`): the metrics key (`proxy.metrics_key`,
a scraper's credential that opens nothing else) or the admin key.
"""

from __future__ import annotations

from collections.abc import Iterator

from litestar import Request, Response, get
from litestar import Router as Routes
from litestar.di import NamedDependency, Provide
from prometheus_client import CollectorRegistry, Counter, GCCollector, Histogram, ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector as Source

from ..collector import Collector
from .auth import Doors
from .pool import Pool, ReplicaState
from .routing import Route, Router

# An exchange takes from tens of milliseconds (an error, a short tool call from a warm
# cache) to minutes (a long answer, a stream timed to its last event): the buckets span
# 50 ms to 2 min, about doubling, so a p99 of either kind falls between two of them.
DURATION_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)


class Metrics:
    """One server's metrics: the exchanges it counted, and the sources read at scrape time."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "onjob_requests",
            "Exchanges this process finished (answered, failed or refused by the engine), "
            "by lineage, arm (live, canary, pinned) and HTTP status.",
            ("alias", "arm", "status"),
            registry=self.registry,
        )
        self.duration = Histogram(
            "onjob_request_duration_seconds",
            "Time from a request's arrival to its answer's end (a stream's last event), "
            "by lineage and arm; failures included.",
            ("alias", "arm"),
            buckets=DURATION_BUCKETS_S,
            registry=self.registry,
        )
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, memory, fds
        GCCollector(registry=self.registry)  # python_gc_*: the GC tuning of `cli/server.py`
        self._children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    def observe(self, route: Route, status: int, seconds: float) -> None:
        """One finished exchange. On the hot path: each (lineage, arm, status)'s two
        children are looked up once and kept (their number is bounded: lineages are the
        routing's, statuses HTTP's); 1.7 µs an exchange on these machines, under 1% of
        the ~220 µs the proxy spends on one."""
        key = (route.lineage, route.arm, status)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self.requests.labels(route.lineage, route.arm, str(status)),
                self.duration.labels(route.lineage, route.arm),
            )
        children[0].inc()
        children[1].observe(seconds)

    def watch(self, source: Source) -> None:
        """Read `source` (its `collect()`) at each scrape too."""
        self.registry.register(source)

    def scrape(self, accept: str | None) -> tuple[bytes, str]:
        """The exposition and its media type: Prometheus' text format, or OpenMetrics when
        the scraper's `Accept` prefers it (as Prometheus itself does)."""
        encode, media_type = choose_encoder(accept or "")
        return encode(self.registry), media_type


class Readings:
    """The proxy's state, read at each scrape: the engines, the routing, the collector."""

    def __init__(self, pool: Pool, router: Router, collector: Collector) -> None:
        self.pool = pool
        self.router = router
        self.collector = collector

    def collect(self) -> Iterator[Metric]:
        yield from self._engines()
        yield from self._routing()
        yield from self._collector()

    def _engines(self) -> list[Metric]:
        in_flight = GaugeMetricFamily(
            "onjob_engine_requests_in_flight",
            "Requests this process has sent to the engine and not finished (a stream until "
            "its end).",
            labels=["engine"],
        )
        state = GaugeMetricFamily(
            "onjob_engine_state",
            "1 for the engine's state as the health checks last saw it (up, reloading its "
            "adapters, down), 0 for the others.",
            labels=["engine", "state"],
        )
        missing = GaugeMetricFamily(
            "onjob_engine_adapters_missing",
            "Adapters the routing sends to that the engine does not serve (their requests go "
            "to another engine, or are answered 503 until it is loaded again).",
            labels=["engine"],
        )
        for replica in self.pool.replicas:
            in_flight.add_metric([replica.url], replica.outstanding)
            for each in ReplicaState:
                state.add_metric([replica.url, str(each)], float(replica.state is each))
            missing.add_metric([replica.url], len(replica.missing))
        return [in_flight, state, missing]

    def _routing(self) -> list[Metric]:
        fraction = GaugeMetricFamily(
            "onjob_canary_fraction",
            "Share of the lineage's conversations its canary serves (0: no canary).",
            labels=["alias"],
        )
        routing = InfoMetricFamily(
            "onjob_routing",
            "The checkpoints each lineage serves (live empty: the base model).",
            labels=["alias"],
        )
        for lineage, arms in sorted(self.router.arms.items()):
            fraction.add_metric([lineage], arms.fraction if arms.canary else 0.0)
            routing.add_metric([lineage], {"live": arms.live or "", "canary": arms.canary or ""})
        return [fraction, routing]

    def _collector(self) -> list[Metric]:
        stats = self.collector.stats()
        untrainable = CounterMetricFamily(
            "onjob_collector_untrainable",
            "Exchanges this process spooled that are kept from training, by reason.",
            labels=["reason"],
        )
        for reason, count in sorted(stats.untrainable.items()):
            untrainable.add_metric([reason], count)
        return [
            CounterMetricFamily(
                "onjob_collector_spooled",
                "Exchanges this process wrote to its spool.",
                value=stats.spooled,
            ),
            CounterMetricFamily(
                "onjob_collector_loaded",
                "Exchanges loaded into DuckDB, whichever process or host spooled them.",
                value=stats.loaded,
            ),
            CounterMetricFamily(
                "onjob_collector_unlogged",
                "Exchanges answered but not logged: the spool directory was full.",
                value=stats.unlogged,
            ),
            untrainable,
            GaugeMetricFamily(
                "onjob_spool_backlog_segments",
                "Spool segments on disk not yet loaded into DuckDB (the open one included).",
                value=stats.backlog_segments,
            ),
            GaugeMetricFamily(
                "onjob_spool_backlog_bytes",
                "What those segments hold.",
                value=stats.backlog_bytes,
            ),
            GaugeMetricFamily(
                "onjob_spool_failed_segments",
                "Segments, or lines of one, set aside in the spool's failed/ directory.",
                value=stats.failed_segments,
            ),
            GaugeMetricFamily(
                "onjob_catalog_unreachable_seconds",
                "How long a DuckLake's catalog has not answered this server (0: it answers).",
                value=stats.catalog_unreachable_s or 0.0,
            ),
        ]


@get("/", include_in_schema=False)
async def scrape(request: Request, metrics: NamedDependency[Metrics]) -> Response:
    body, media_type = metrics.scrape(request.headers.get("accept"))
    return Response(body, media_type=media_type)


def routes(metrics: Metrics, doors: Doors) -> Routes:
    """`GET /metrics`, behind the metrics key or the admin key."""
    return Routes(
        "/metrics",
        guards=[doors.metrics_guard],
        dependencies={"metrics": Provide(lambda: metrics, use_cache=True, sync_to_thread=False)},
        route_handlers=[scrape],
    )
