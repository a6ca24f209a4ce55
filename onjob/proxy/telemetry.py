"""One OpenTelemetry span per proxied request, with GenAI semantic-convention attributes.

The proxy is handed a tracer only when an exporter is configured (`deploy` sets up
the SDK); with none, nothing here runs on the hot path.
"""

from __future__ import annotations

from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from .exchange import Exchange


def start(tracer: Tracer | None, exchange: Exchange) -> Span | None:
    if tracer is None:
        return None
    asked = exchange.asked.typed
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "onjob",
        "gen_ai.request.model": exchange.route.alias,
        # The conversation as the proxy knows it (its name, else a hash of its opening); the
        # trajectory id and turn are given when the spool is loaded.
        "gen_ai.conversation.id": exchange.where.conversation.replace("\0", ":"),
        "onjob.exchange.id": exchange.id,
        "onjob.scenario.key": exchange.where.keys.scenario_key,
        "onjob.arm": exchange.route.arm,
        "onjob.stream": exchange.stream,
    }
    for name, value in (
        ("gen_ai.request.temperature", asked.temperature),
        ("gen_ai.request.top_p", asked.top_p),
        ("gen_ai.request.max_tokens", asked.max_tokens),
        ("gen_ai.request.choice.count", asked.n),
    ):
        if value is not None:
            attributes[name] = value
    return tracer.start_span(
        f"chat {exchange.route.alias}", kind=SpanKind.SERVER, attributes=attributes
    )


def end(span: Span | None, exchange: Exchange) -> None:
    if span is None:
        return
    span.set_attribute("gen_ai.response.id", exchange.id)
    span.set_attribute("gen_ai.response.model", exchange.route.model)
    span.set_attribute("http.response.status_code", exchange.status)
    usage = exchange.usage or {}
    if "prompt_tokens" in usage:
        span.set_attribute("gen_ai.usage.input_tokens", usage["prompt_tokens"])
    if "completion_tokens" in usage:
        span.set_attribute("gen_ai.usage.output_tokens", usage["completion_tokens"])
    reasons = [c.finish_reason for c in exchange.choices.values() if c.finish_reason]
    if reasons:
        span.set_attribute("gen_ai.response.finish_reasons", reasons)
    if exchange.status >= 400:
        span.set_attribute("error.type", str(exchange.status))
        span.set_status(Status(StatusCode.ERROR, exchange.error))
    span.end()
