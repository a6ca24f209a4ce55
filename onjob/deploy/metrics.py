"""The loop's state in `GET /metrics` (the proxy serves it: `proxy/metrics.py`), read from
`PeriodicLoop.state` at each scrape, as `GET /admin/status` reads it (`LoopView`)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from .loop import PeriodicLoop

IDLE = "idle"  # the loop's stage between iterations (`LoopState.doing` returns to it)


class LoopReadings:
    """`onjob_loop_*`: whether the loop runs, its stage, the time spent per stage, and each
    lineage's groups ready to train on against what starts a run."""

    def __init__(self, loop: PeriodicLoop) -> None:
        self.loop = loop

    def collect(self) -> Iterator[Metric]:
        state = self.loop.state
        yield GaugeMetricFamily(
            "onjob_loop_enabled",
            "1 when the loop runs iterations (loop.interval_s > 0).",
            value=float(self.loop.settings.loop.interval_s > 0),
        )
        yield GaugeMetricFamily(
            "onjob_loop_paused", "1 while the loop is paused.", value=float(state.paused)
        )
        stage = GaugeMetricFamily(
            "onjob_loop_stage",
            "1 for the stage the loop is in (idle between iterations), 0 for the others it "
            "has been in since start.",
            labels=["stage"],
        )
        for name in sorted({IDLE, state.stage, *state.seconds}):
            stage.add_metric([name], float(name == state.stage))
        yield stage
        yield GaugeMetricFamily(
            "onjob_loop_stage_started_timestamp_seconds",
            "Unix time the current stage began.",
            value=state.since,
        )
        spent = CounterMetricFamily(
            "onjob_loop_stage_seconds",
            "Wall time spent in each stage since start, counted as each spell of it ends.",
            labels=["stage"],
        )
        for name, seconds in sorted(state.seconds.items()):
            spent.add_metric([name], seconds)
        yield spent
        yield CounterMetricFamily(
            "onjob_loop_iterations", "Iterations begun since start.", value=state.iterations
        )
        ready = GaugeMetricFamily(
            "onjob_loop_ready_groups",
            "Scored groups the lineage could train on, at the last iteration.",
            labels=["alias"],
        )
        wanted = GaugeMetricFamily(
            "onjob_loop_wanted_groups",
            "Scored groups that start the lineage's next run (fitted to its traffic).",
            labels=["alias"],
        )
        for lineage, line in sorted(state.lineages.items()):
            ready.add_metric([lineage], line.ready_groups)
            wanted.add_metric([lineage], line.wanted_groups)
        yield ready
        yield wanted
