"""OpenTelemetry set-up: a tracer for the proxy only when an exporter is configured."""

from __future__ import annotations

from typing import Literal

from opentelemetry.trace import Tracer
from pydantic import BaseModel, ConfigDict, Field


class TelemetrySettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    exporter: Literal["none", "console", "otlp"] = Field(
        "none",
        description="where spans go; otlp needs `pip install -e '.[otlp]'` in onjob's checkout",
    )
    otlp_endpoint: str | None = Field(
        None, description="e.g. http://collector:4318/v1/traces (default: OTEL_* variables)"
    )
    service_name: str = "onjob"


def tracer(settings: TelemetrySettings) -> Tracer | None:
    if settings.exporter == "none":
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if settings.exporter == "console":
        exporter = ConsoleSpanExporter()
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise RuntimeError(
                "telemetry.exporter = 'otlp' needs the OTLP exporter: "
                "pip install -e '.[otlp]' in onjob's checkout"
            ) from exc
        exporter = OTLPSpanExporter(endpoint=settings.otlp_endpoint)
    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider.get_tracer("onjob.proxy")
