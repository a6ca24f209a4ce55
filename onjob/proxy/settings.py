"""Proxy settings (composed into the server's settings in `deploy`)."""

from __future__ import annotations

import ipaddress
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..collector.scope import SEPARATOR
from ..logprobs import TRAINED, LogprobsMode


class Canary(BaseModel):
    model_config = ConfigDict(frozen=True)

    checkpoint: str = Field(min_length=1)
    fraction: float = Field(0.1, ge=0, le=1)


class ProxySettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=0, le=65535)
    engine_url: str = Field(
        "http://127.0.0.1:8001/v1",
        description="the engine's OpenAI base URL (vLLM or local); with engine_urls, the one "
        "the judge and the trainer use (default: the first of them)",
    )
    engine_urls: list[str] = Field(
        default_factory=list,
        description="several engines serving the same base model: requests go to the healthy "
        "one with the fewest outstanding, and every live and canary adapter is loaded into "
        "each (empty: engine_url alone)",
    )
    engine_logprobs: LogprobsMode = Field(
        TRAINED,
        description="the logprob definition the engines were started with (vLLM's "
        "--logprobs-mode; `onjob engine --backend vllm` passes raw_logprobs); recorded with "
        "each exchange, and the trainer refuses groups logged under any but raw_logprobs. "
        "An engine whose model list states its own (the local engine) is taken at its word",
    )
    engine_token: str | None = Field(
        None,
        description="the engines' adapter token (the local engine's "
        "ONJOB_ENGINE_ADAPTER_TOKEN), sent as `Authorization: Bearer` with onjob's own "
        "requests to them (adapter loads, health checks, the judge's samples); with "
        "--start-engine and none set, onjob makes one for its child and keeps it beside "
        "the database (<db>.engine-token, mode 0600), where `onjob doctor`, `onjob loop` "
        "and the other commands read it",
    )
    engines_resolve_adapters: bool = Field(
        False,
        description="the engines load an adapter by name on its first request (started with "
        "--adapter-cache-dir and --adapter-bucket, checkpoints published to trainer.bucket): "
        "a replica is not held back, nor loaded into by path, for an adapter it has not "
        "loaded yet, so a new or restarted replica on another host serves at once",
    )
    health_interval_s: float = Field(
        1.0,
        gt=0,
        description="how often each engine's /health and /v1/models are read (a restarted "
        "engine gets its adapters back before it gets traffic again)",
    )
    aliases: dict[str, str | None] = Field(
        default_factory=lambda: {"agent": None},
        description='model name clients use -> live checkpoint (adapter name; "": base model)',
    )
    canaries: dict[str, Canary] = Field(
        default_factory=dict,
        description="alias -> canary checkpoint and the fraction of conversations it serves",
    )
    untrained_unstored_keys: list[str] = Field(
        default_factory=list,
        description="API key ids whose Responses API calls with `store: false` are logged "
        "(source 'unstored': kept in the log, and deleted by `onjob forget` like the rest) "
        "but never judged, compared or trained on; other keys' `store: false` calls are "
        "learnt from like any traffic",
    )
    api_keys: dict[str, str] = Field(
        default_factory=dict, description="key id -> secret; when set, every request needs one"
    )
    untrained_keys: list[str] = Field(
        default_factory=list,
        description="API key ids whose traffic is logged (and served by the alias's adapter "
        "like any key's) but never re-sampled, grouped, judged, compared or trained on, "
        "whatever they send; also keeps out what they logged before being listed, while "
        "listed (a retired key may stay listed). Needs api_keys",
    )
    tenants: dict[str, list[str]] = Field(
        default_factory=dict,
        description="tenant name -> the API key ids it holds: each tenant gets a lineage per "
        "alias of its own (live and canary adapters, candidates, tests and release decisions, "
        "learnt from its keys' traffic alone), starting from the alias's configured live "
        "checkpoint; a key no tenant holds is served by, and trains, the alias's shared "
        "lineage. Needs api_keys",
    )
    admin_key: str | None = Field(
        None,
        description="secret for /admin (status, canary, promote, rollback, sql, ...) and the "
        "dashboard; unset: `onjob serve` makes one at its first start, kept in <db>.admin-key "
        "(mode 0600) and read from there by the other commands",
    )
    metrics_key: str | None = Field(
        None,
        min_length=1,
        description="secret for GET /metrics (Prometheus' text format) alone, a scraper's "
        "credential that opens nothing else; the admin key is taken there too (unset: the "
        "admin key alone)",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="host names (besides IP addresses, localhost and proxy.host) by which "
        "browsers and clients reach this server, e.g. a reverse proxy's: the admin API and "
        "the dashboard refuse any other Host, every route any other Origin (DNS rebinding, "
        "cross-site posts)",
    )
    max_body_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="largest request body (bigger: 413)"
    )
    max_n: int = Field(16, ge=1, description="most choices one request may ask for (`n`)")
    max_tokens_limit: int = Field(
        32768, ge=1, description="largest `max_tokens` / `max_completion_tokens` a request may ask"
    )
    connect_timeout_s: float = Field(5.0, gt=0)
    read_timeout_s: float = Field(300.0, gt=0, description="longest silence from the engine")
    answer_timeout_s: float = Field(
        900.0,
        gt=0,
        description="longest a whole (non-streamed) answer may take, from the request to its "
        "last byte, however steadily the engine drips it (past it: 504, logged as a failure; "
        "streams are bounded by read_timeout_s between bytes)",
    )
    max_answer_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="largest answer body the engine may send, whole or streamed (past it: 502, "
        "the connection closed, logged as a failure)",
    )
    max_messages: int = Field(
        4096,
        ge=1,
        description="most messages (or Responses input items) one request may carry (more: "
        "400): each is checked and hashed on the event loop before the request is sent",
    )
    max_connections: int = Field(1024, ge=1, description="connections to the engine")
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="longest a client may take to send a request's headers, from its first "
        "byte (past it: 408 and the connection closed)",
    )
    body_timeout_s: float = Field(
        60.0,
        gt=0,
        description="longest a client may take to send a request's body once its headers are "
        "in (past it: the connection closed; nothing was answered, so nothing is logged)",
    )
    max_client_connections: int = Field(
        1024,
        ge=1,
        description="connections and requests in flight from clients, per process (past it: "
        "503); keep it under the process's open-file limit (`ulimit -n`)",
    )
    lookup_wait_s: float = Field(
        10.0,
        ge=0,
        description="how long a request naming an answer given just now (previous_response_id, "
        "feedback, a stored Response) waits for it to reach the database: with "
        "collector.bucket, another host's answer arrives within a hand-off round or two; an "
        "id older than this is looked up once",
    )
    shutdown_grace_s: float = Field(
        30.0,
        ge=0,
        description="on SIGTERM, SIGINT or SIGHUP: how long requests in flight may take to finish "
        "before they are cut (new connections are refused at once; a second signal exits "
        "at once)",
    )
    workers: int = Field(
        1,
        ge=1,
        description="processes answering on the port: this one (which loads the spool, "
        "stitches, judges and trains) and workers-1 proxy-only ones (SO_REUSEPORT); with "
        "loader_apart, workers proxy-only ones",
    )
    loader_apart: bool = Field(
        False,
        description="the process that owns the database (loads the spool, judges, trains, "
        "serves the admin API) answers no OpenAI request itself: `workers` proxy-only "
        "processes do, so loading into DuckDB takes neither memory nor CPU in the process "
        "answering (ignored by a proxy-only process)",
    )
    primary_url: str | None = Field(
        None,
        description="proxy only: the onjob server that owns the database (its base URL, "
        "e.g. http://10.0.0.5:8000); this process answers the OpenAI routes, writes the "
        "shared spool (collector.spool_dir) and forwards the rest there",
    )

    @model_validator(mode="before")
    @classmethod
    def _judge_on_the_first_replica(cls, data):
        # The judge re-samples the checkpoints, so its engine must be one the operator loads
        # them into: unset, the first of `engine_urls`.
        if isinstance(data, dict) and data.get("engine_urls") and "engine_url" not in data:
            data = {**data, "engine_url": data["engine_urls"][0]}
        return data

    @model_validator(mode="after")
    def _judge_on_a_replica(self) -> ProxySettings:
        if self.engine_urls and self.engine_url not in self.engine_urls:
            raise ValueError(
                f"engine_url {self.engine_url} is not one of engine_urls: the judge would "
                "sample from an engine no adapter is loaded into"
            )
        return self

    @property
    def replica_urls(self) -> list[str]:
        return self.engine_urls or [self.engine_url]

    @field_validator("aliases")
    @classmethod
    def _empty_is_base(cls, aliases: dict[str, str | None]) -> dict[str, str | None]:
        # TOML has no null: an empty string names the base model.
        return {alias: checkpoint or None for alias, checkpoint in aliases.items()}

    @field_validator("api_keys")
    @classmethod
    def _distinct_secrets(cls, keys: dict[str, str]) -> dict[str, str]:
        if len(set(keys.values())) != len(keys):
            raise ValueError("two API key ids share one secret")
        if any(not secret for secret in keys.values()):
            raise ValueError("an API key secret is empty")
        if any(not key_id or ":" in key_id for key_id in keys):
            # A conversation a client names is stored as `<key id>:<name>`
            # (`collector.trajectories.scoped`): one key's names never reach another's.
            raise ValueError("an API key id is empty or holds ':'")
        return keys

    @model_validator(mode="after")
    def _untrained_keys_need_api_keys(self) -> ProxySettings:
        # With no API keys every exchange is of no key: the list would keep nothing out,
        # silently.
        if self.untrained_keys and not self.api_keys:
            raise ValueError(
                "proxy.untrained_keys names API key ids, but proxy.api_keys is empty: no "
                "exchange would be kept out of training"
            )
        if any(not key_id for key_id in self.untrained_keys):
            raise ValueError("an id in proxy.untrained_keys is empty")
        return self

    @model_validator(mode="after")
    def _tenants_hold_known_keys(self) -> ProxySettings:
        if not self.tenants:
            return self
        if not self.api_keys:
            raise ValueError("proxy.tenants names API key ids, but proxy.api_keys is empty")
        held: dict[str, str] = {}
        for tenant, keys in self.tenants.items():
            if not TENANT_NAME.fullmatch(tenant):
                raise ValueError(
                    f"tenant name {tenant[:60]!r}: use letters, digits, '.', '_' or '-' "
                    "(it names the tenant's lineage, `alias@tenant`)"
                )
            if not keys:
                raise ValueError(f"tenant {tenant!r} holds no API key")
            for key_id in keys:
                if key_id not in self.api_keys:
                    raise ValueError(f"tenant {tenant!r}: {key_id!r} is not in proxy.api_keys")
                if key_id in held:
                    raise ValueError(
                        f"API key {key_id!r} is in tenants {held[key_id]!r} and {tenant!r}"
                    )
                if key_id in self.untrained_keys:
                    # Its lineage could never learn: the key's traffic is never trained on.
                    raise ValueError(
                        f"tenant {tenant!r}: {key_id!r} is in proxy.untrained_keys, so it gets "
                        "no lineage; leave it out of proxy.tenants"
                    )
                held[key_id] = tenant
        if bad := [a for a in self.aliases if SEPARATOR in a]:
            raise ValueError(
                f"alias {bad[0]!r} holds {SEPARATOR!r}, which names a tenant's lineage"
            )
        return self

    @model_validator(mode="after")
    def _keys_beyond_loopback(self) -> ProxySettings:
        if not self.api_keys and not _is_loopback(self.host):
            raise ValueError(
                f"refusing to listen on {self.host} with no API keys: anyone who can reach it "
                "could use the model and write to the database. Configure proxy.api_keys "
                '(e.g. ONJOB_PROXY__API_KEYS=\'{"myapp": "sk-..."}\') or listen on 127.0.0.1.'
            )
        return self


TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
