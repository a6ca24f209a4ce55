"""The tables and their migrations.

`MIGRATIONS[i]` upgrades a database from version i to i+1. Opening a database
applies whatever it lacks, in one transaction per step, and records the version
in `schema_version`. Never edit a released migration: append a new one.
"""

from __future__ import annotations

import duckdb

V1 = """
CREATE TABLE exchanges (
    id VARCHAR PRIMARY KEY,
    ts TIMESTAMPTZ NOT NULL,
    trajectory_id VARCHAR NOT NULL,
    turn INTEGER NOT NULL,
    scenario_id VARCHAR NOT NULL,
    api_key_id VARCHAR,
    model_alias VARCHAR,
    checkpoint VARCHAR,
    arm VARCHAR,
    stream BOOLEAN,
    request JSON,
    response JSON,
    prompt_token_ids INTEGER[],
    completion_token_ids INTEGER[][],
    completion_logprobs DOUBLE[][],
    usage JSON,
    latency_ms DOUBLE,
    status INTEGER,
    error VARCHAR,
    metadata JSON,
    source VARCHAR NOT NULL DEFAULT 'production',
    continuation_hashes VARCHAR[]
);
CREATE TABLE trajectories (
    id VARCHAR PRIMARY KEY,
    scenario_id VARCHAR NOT NULL,
    checkpoint VARCHAR,
    arm VARCHAR,
    first_exchange VARCHAR,
    last_exchange VARCHAR,
    n_turns INTEGER NOT NULL,
    source VARCHAR NOT NULL DEFAULT 'production',
    first_ts TIMESTAMPTZ,
    last_ts TIMESTAMPTZ
);
CREATE TABLE scenarios (
    id VARCHAR PRIMARY KEY,
    key VARCHAR NOT NULL,
    keyed VARCHAR NOT NULL,
    first_seen TIMESTAMPTZ,
    count BIGINT NOT NULL
);
CREATE TABLE groups (
    id VARCHAR PRIMARY KEY,
    scenario_id VARCHAR,
    prefix_exchange VARCHAR,
    kind VARCHAR NOT NULL,
    checkpoints VARCHAR[],
    status VARCHAR NOT NULL,
    reason VARCHAR,
    created TIMESTAMPTZ
);
CREATE TABLE scores (
    id VARCHAR PRIMARY KEY,
    group_id VARCHAR,
    member_id VARCHAR NOT NULL,
    source VARCHAR NOT NULL,
    score DOUBLE NOT NULL,
    explanation VARCHAR,
    cache_key VARCHAR,
    created TIMESTAMPTZ
);
CREATE TABLE feedback (
    id VARCHAR PRIMARY KEY,
    exchange_id VARCHAR,
    trajectory_id VARCHAR,
    api_key_id VARCHAR,
    value DOUBLE NOT NULL,
    comment VARCHAR,
    ts TIMESTAMPTZ NOT NULL
);
CREATE TABLE checkpoints (
    name VARCHAR PRIMARY KEY,
    parent VARCHAR,
    base_model VARCHAR,
    path VARCHAR,
    created TIMESTAMPTZ,
    train_run VARCHAR,
    status VARCHAR NOT NULL
);
CREATE TABLE train_runs (
    id VARCHAR PRIMARY KEY,
    groups_used VARCHAR[],
    config JSON,
    metrics JSON,
    duration_s DOUBLE,
    created TIMESTAMPTZ
);
CREATE TABLE deployments (
    ts TIMESTAMPTZ NOT NULL,
    model_alias VARCHAR NOT NULL,
    live VARCHAR,
    canary VARCHAR,
    fraction DOUBLE,
    reason VARCHAR,
    actor VARCHAR
);
"""

# The spool segments loaded but not yet deleted: a segment is loaded in one
# transaction with its row here, so a crash between the commit and the unlink
# never loads it twice (and no insert has to anti-join the whole table).
V2 = """
CREATE TABLE loaded_segments (
    name VARCHAR PRIMARY KEY,
    exchanges INTEGER NOT NULL,
    loaded_at TIMESTAMPTZ NOT NULL
);
"""

# The judge's side of groups: who is in a group (a completion of an exchange, or a
# whole trajectory), and each call to a RULER judge with the order it showed the
# members in (judges favour positions), its cost, and what a cache hit reuses.
V3 = """
CREATE TABLE members (
    id VARCHAR PRIMARY KEY,
    group_id VARCHAR NOT NULL,
    position INTEGER NOT NULL,
    exchange_id VARCHAR NOT NULL,
    choice INTEGER NOT NULL,
    trajectory_id VARCHAR,
    origin VARCHAR NOT NULL
);
CREATE TABLE judgements (
    id VARCHAR PRIMARY KEY,
    group_id VARCHAR NOT NULL,
    judge VARCHAR NOT NULL,
    cache_key VARCHAR NOT NULL,
    member_order VARCHAR[],
    status VARCHAR NOT NULL,
    error VARCHAR,
    attempts INTEGER NOT NULL,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    cost_usd DOUBLE,
    latency_ms DOUBLE,
    answer VARCHAR,
    result JSON,
    created TIMESTAMPTZ NOT NULL
);
ALTER TABLE scores ADD COLUMN judgement_id VARCHAR;
ALTER TABLE groups ADD COLUMN scored_at TIMESTAMPTZ;
"""

# Every routing change says why: the comparison's figures travel with it.
V4 = """
ALTER TABLE deployments ADD COLUMN evidence JSON;
"""

# A paired comparison's groups name the test they are evidence for (a canary's, or one
# `onjob compare` run), so no run's pairs count toward another's decision; a pair whose
# sampling failed keeps which arm failed (a canary that cannot answer loses the pair).
V5 = """
ALTER TABLE groups ADD COLUMN test VARCHAR;
ALTER TABLE groups ADD COLUMN failed_arm VARCHAR;
"""

# What the engine said answered each exchange (its response's `model`): with several
# engines, or one restarted without its adapters, the checkpoint routed to and the model
# that answered can differ, and a stale adapter must show in the data.
V6 = """
ALTER TABLE exchanges ADD COLUMN served_model VARCHAR;
"""

# Which logprob definition the sampler used for each exchange (`onjob.logprobs`): the
# trainer's importance ratio divides its own raw logprobs by these, so a group recorded
# under another definition is refused (NULL: logged before this column, taken as raw).
V7 = """
ALTER TABLE exchanges ADD COLUMN logprobs_mode VARCHAR;
"""

# What `onjob forget` and retention deleted, kept as a rule (`collector/forget.py`): the
# loader drops every spool line it matches (a trajectory's or an API key's lines up to
# `until`, or with both NULL every line before `until`), so a segment loaded after the
# deletion (traffic in flight, a replay after a crash) cannot bring the rows back.
V8_FORGOTTEN = """
CREATE TABLE forgotten (
    id VARCHAR PRIMARY KEY,
    ts TIMESTAMPTZ NOT NULL,
    trajectory_id VARCHAR,
    api_key_id VARCHAR,
    until TIMESTAMPTZ NOT NULL,
    exchanges BIGINT,
    actor VARCHAR
);
"""

# Which OpenAI API the client called (NULL: chat completions, as before this column;
# 'responses'; 'completions'): the row's `request` and `response` are always chat-shaped
# for the Responses API (translated at the proxy's edge, so the judge and trainer read
# one format), and the Response object a client may GET back lives in `api_object` with
# its input items, on the exchange row itself: as durable as the exchange (spooled before
# the answer leaves), with no second store to keep in step. NULL `api_object`: never
# stored (`store: false`) or deleted.
V9_RESPONSES_API = """
ALTER TABLE exchanges ADD COLUMN api VARCHAR;
ALTER TABLE exchanges ADD COLUMN api_object JSON;
"""

# Linear storage (`linear.py`): a turn that continues its conversation's previous answered
# exchange (`parent_id`) stores only what is new: in `request.messages` the messages past
# the first `messages_kept` of the parent's request, in `prompt_token_ids` the ids past the
# first `prompt_kept` of the parent's prompt + first completion; a large top-level field
# equal to the parent's (`tools`, a `response_format` schema) is left out and named in
# `request_kept`. `parent_id` NULL: the row
# is stored whole, as every row before this step is (they stay as they are).
# `exchanges_rebuilt(ids, every)` gives the rows `ids` (or every row) with their full
# `request` and `prompt_token_ids`, exactly: it walks each delta row up to its whole
# ancestor (`path`; the cap is the fewest messages / tokens any row below an ancestor keeps
# of it; a parent is always of the same trajectory, so the walk follows only the links of
# the rows' trajectories), then concatenates each ancestor's kept slice, oldest first (a
# field named in `request_kept` is the nearest ancestor's that stores it). The view
# `exchanges_full` is every row (for `onjob sql`, exports, scans); a reader of a few rows
# names them, so the walk starts from those alone (DuckDB pushes no filter into a
# recursive CTE). Everything that reads requests or prompt ids reads one of the two.
V10_LINEAR = """
ALTER TABLE exchanges ADD COLUMN parent_id VARCHAR;
ALTER TABLE exchanges ADD COLUMN messages_kept INTEGER;
ALTER TABLE exchanges ADD COLUMN prompt_kept INTEGER;
ALTER TABLE exchanges ADD COLUMN request_kept VARCHAR[];
"""

_REBUILT_TEMPLATE = """
CREATE MACRO exchanges_rebuilt(ids, every) AS TABLE
WITH RECURSIVE links AS MATERIALIZED (
    SELECT id, parent_id, messages_kept, prompt_kept FROM exchanges
    WHERE parent_id IS NOT NULL AND (every OR trajectory_id IN (
        SELECT trajectory_id FROM exchanges WHERE list_contains(ids, id)))
),
path(id, anc, depth, cap_m, cap_t) AS (
    SELECT id, id, 0, 2147483647, 2147483647 FROM links
    WHERE every OR list_contains(ids, id)
    UNION ALL
    SELECT p.id, x.parent_id, p.depth + 1, least(p.cap_m, x.messages_kept),
           least(p.cap_t, x.prompt_kept)
    FROM path p JOIN links x ON x.id = p.anc
),
rebuilt AS (
    SELECT p.id,
        flatten(list(
            list_slice(CAST(a.request -> '$.messages' AS JSON[]), 1,
                       greatest(p.cap_m - coalesce(a.messages_kept, 0), 0))
            ORDER BY p.depth DESC)) AS messages,
        flatten(list(list_concat(
            list_slice(coalesce(a.prompt_token_ids, []), 1,
                       greatest(p.cap_t - coalesce(a.prompt_kept, 0), 0)),
            CASE WHEN p.depth > 0 THEN list_slice(
                coalesce(a.completion_token_ids[1], []), 1,
                greatest(p.cap_t - coalesce(a.prompt_kept, 0)
                         - len(coalesce(a.prompt_token_ids, [])), 0))
            ELSE [] END)
            ORDER BY p.depth DESC)) AS prompt_token_ids
    FROM path p JOIN {ancestors} a ON a.id = p.anc
    GROUP BY p.id
),
kept AS (
    SELECT id, unnest(request_kept) AS key FROM exchanges
    WHERE request_kept IS NOT NULL AND id IN (SELECT id FROM path WHERE depth = 0)
),
fields AS (
    SELECT id, json_group_object(key, value) AS fields FROM (
        SELECT k.id, k.key, arg_min(a.request -> k.key, p.depth) AS value
        FROM kept k JOIN path p ON p.id = k.id AND p.depth > 0
        JOIN {ancestors} a ON a.id = p.anc
        WHERE (a.request -> k.key) IS NOT NULL
        GROUP BY k.id, k.key)
    GROUP BY id
)
SELECT e.* REPLACE (
    CASE WHEN e.parent_id IS NULL THEN e.request
         ELSE json_merge_patch(
             json_merge_patch(e.request, coalesce(f.fields, '{}')),
             json_object('messages', to_json(r.messages)))
    END AS request,
    CASE WHEN e.parent_id IS NULL OR e.prompt_token_ids IS NULL THEN e.prompt_token_ids
         ELSE r.prompt_token_ids
    END AS prompt_token_ids)
FROM exchanges e LEFT JOIN rebuilt r ON r.id = e.id LEFT JOIN fields f ON f.id = e.id
WHERE every OR list_contains(ids, e.id);
CREATE VIEW exchanges_full AS SELECT * FROM exchanges_rebuilt([]::VARCHAR[], true);
"""
_REBUILT = _REBUILT_TEMPLATE.replace("{ancestors}", "exchanges")

V10_LINEAR += _REBUILT

# The sampler's logprobs are float32 on every engine (vLLM's and the local one's tensors):
# stored as FLOAT they lose nothing and take half the space of DOUBLE. The rebuild macro
# and view read `exchanges.*`, so they are made again around the change.
V11_FLOAT_LOGPROBS = (
    """
DROP VIEW exchanges_full;
DROP MACRO TABLE exchanges_rebuilt;
ALTER TABLE exchanges ALTER completion_logprobs SET DATA TYPE FLOAT[][];
"""
    + _REBUILT
)

# Openings (`linear.py`): what conversations of one system prompt and tool set share at
# their start, stored once. A first turn's `parent_id` names one (`opn_...`) as a later
# turn's names its parent exchange, and its `*_kept` columns count into it the same way;
# the rebuild reads openings as ancestors (with no completion). Deleted when no row refers
# to one (`forget.py`).
_REBUILT_WITH_OPENINGS = _REBUILT_TEMPLATE.replace(
    "{ancestors}",
    """(
    SELECT id, request, prompt_token_ids, completion_token_ids, messages_kept, prompt_kept
    FROM exchanges
    UNION ALL
    SELECT id, request, prompt_token_ids, NULL, NULL, NULL FROM openings)""",
)
V12_OPENINGS = (
    """
CREATE TABLE openings (
    id VARCHAR PRIMARY KEY,
    api_key_id VARCHAR,
    ts TIMESTAMPTZ NOT NULL,
    request JSON,
    prompt_token_ids INTEGER[]
);
DROP VIEW exchanges_full;
DROP MACRO TABLE exchanges_rebuilt;
"""
    + _REBUILT_WITH_OPENINGS
)

# One rule for what may be trained on (`onjob.logprobs.untrainable`): the reason an
# answered exchange may not be, NULL when it may. Rows logged before this are given the
# rule's verdict here, in SQL (the same checks in the same order), so a judge pass or a
# snapshot after the upgrade takes none of them either. The rebuild macro and view read
# `exchanges.*`, so they are made again around the change.
V14_UNTRAINABLE = (
    """
DROP VIEW exchanges_full;
DROP MACRO TABLE exchanges_rebuilt;
ALTER TABLE exchanges ADD COLUMN untrainable VARCHAR;
UPDATE exchanges SET untrainable = CASE
    WHEN logprobs_mode LIKE '%+grammar' THEN 'masked'
    WHEN logprobs_mode IS DISTINCT FROM 'raw_logprobs' THEN 'definition'
    WHEN completion_token_ids IS NULL OR completion_logprobs IS NULL
      OR len(completion_token_ids) = 0
      OR len(completion_token_ids) <> len(completion_logprobs)
      OR list_contains(list_transform(completion_token_ids, lambda x: x IS NULL), true)
      OR list_contains(list_transform(completion_logprobs, lambda x: x IS NULL), true)
      THEN 'no_tokens'
    WHEN TRY_CAST(json_extract(usage, '$.completion_tokens') AS INTEGER) IS NULL
      THEN 'no_usage'
    WHEN list_contains(list_transform(
             list_zip(completion_token_ids, completion_logprobs), lambda p: len(p[1]) <> len(p[2])),
           true)
      OR list_sum(list_transform(completion_token_ids, lambda x: len(x)))
         <> TRY_CAST(json_extract(usage, '$.completion_tokens') AS INTEGER)
      THEN 'count'
    WHEN list_min(list_transform(completion_logprobs, lambda x: list_min(x))) <= -9999.0
      THEN 'no_logprob'
END
WHERE status < 400;
"""
    + _REBUILT_WITH_OPENINGS
)

# Each alias's stream of release candidates (`deploy/decide/ledger.py`): candidate k is tested at
# its share of `loop.alpha` (6 alpha / (pi^2 k^2)), so k must survive restarts, or a
# restarted server would hand out alpha again; outcomes drive the back-off after
# rollbacks and the daily training budget.
V13_CANDIDATES = """
CREATE TABLE candidates (
    alias VARCHAR NOT NULL,
    checkpoint VARCHAR NOT NULL,
    k INTEGER NOT NULL,
    entered TIMESTAMPTZ NOT NULL,
    outcome VARCHAR,
    decided TIMESTAMPTZ,
    PRIMARY KEY (alias, checkpoint)
);
"""

# The release path's durable state (issue 33). `holdout_slice`: whether a scenario is held
# out, decided once when the loop first sees it, so a scenario trained on never becomes
# "held out" later (and one held out is never trained on). `reviews`: a canary that won
# its pairs where no referee other than its coach checks it, waiting for a person's
# `onjob promote` or `rollback`, with the evidence; one row per routing (`routing_ts`,
# the `deployments` row it is about).
V15_RELEASE = """
CREATE TABLE holdout_slice (
    scenario_id VARCHAR PRIMARY KEY,
    held BOOLEAN NOT NULL,
    share DOUBLE NOT NULL,
    decided TIMESTAMPTZ NOT NULL
);
CREATE TABLE reviews (
    model_alias VARCHAR NOT NULL,
    checkpoint VARCHAR NOT NULL,
    routing_ts TIMESTAMPTZ NOT NULL,
    ts TIMESTAMPTZ NOT NULL,
    reason VARCHAR,
    evidence JSON
);
"""

# A canary's rounds (`deploy/decide/ledger.py`): the loop's looks at the canary of one routing
# (`rounds_of`, the `deployments` row's ts), so its cap in rounds survives a restart.
V16_CANARY_ROUNDS = """
ALTER TABLE candidates ADD COLUMN rounds INTEGER DEFAULT 0;
ALTER TABLE candidates ADD COLUMN rounds_of TIMESTAMPTZ;
"""

# The exchanges loaded since the last Parquet export to the bucket (`export.py`), filled
# in the load's own transaction, so no exchange is loaded without being queued (nor queued
# without being loaded); `batch` is set when an export takes them, so a retry after a
# failed upload writes the same rows under the same object names.
V17_EXPORT_QUEUE = """
CREATE TABLE export_queue (id VARCHAR NOT NULL, batch BIGINT);
"""

# Feedback with a name (`metric`: "thumbs", "resolved", ...): each named metric is its own
# score source (`feedback:<metric>`) and checked against the judges on its own; NULL is
# the unnamed feedback posted before metrics had names.
V18_FEEDBACK_METRIC = """
ALTER TABLE feedback ADD COLUMN metric VARCHAR;
"""

# How many times each group was judged (`judge/tables.save_scores`): a pair the referee
# could not score is judged again up to `loop.rejudge_attempts` times before it counts
# as the candidate's loss (`deploy/decide/pairs.py`).
V19_JUDGE_ATTEMPTS = """
ALTER TABLE groups ADD COLUMN attempts INTEGER DEFAULT 0;
"""

# The last verdict the loop reached on each candidate (`deploy/decide/ledger.py`: `record`),
# at its offline test or a look at its canary, with its evidence: what the dashboard shows
# instead of deciding again on every page view.
V20_VERDICTS = """
ALTER TABLE candidates ADD COLUMN verdict JSON;
ALTER TABLE candidates ADD COLUMN verdict_stage VARCHAR;
ALTER TABLE candidates ADD COLUMN verdict_at TIMESTAMPTZ;
"""

# The rebuild's ancestors read only the rows' own trajectories (a parent is always of the
# same trajectory, as `links` already reads; openings are few and shared): DuckDB 2.0
# pushes the join's keys into the scan of `exchanges` by itself, 1.5 reads every row's
# `request` for it (at a million exchanges, one turn rebuilt: 1.6-4.9 s against 11 ms;
# bench/collector/dashboard.py's group page).
_REBUILT_OWN_TRAJECTORIES = _REBUILT_TEMPLATE.replace(
    "{ancestors}",
    """(
    SELECT id, request, prompt_token_ids, completion_token_ids, messages_kept, prompt_kept
    FROM exchanges WHERE every OR trajectory_id IN (
        SELECT trajectory_id FROM exchanges WHERE list_contains(ids, id))
    UNION ALL
    SELECT id, request, prompt_token_ids, NULL, NULL, NULL FROM openings)""",
)
V21_REBUILT_OWN_TRAJECTORIES = (
    """
DROP VIEW exchanges_full;
DROP MACRO TABLE exchanges_rebuilt;
"""
    + _REBUILT_OWN_TRAJECTORIES
)

MIGRATIONS: list[str] = [
    V1,
    V2,
    V3,
    V4,
    V5,
    V6,
    V7,
    V8_FORGOTTEN,
    V9_RESPONSES_API,
    V10_LINEAR,
    V11_FLOAT_LOGPROBS,
    V12_OPENINGS,
    V13_CANDIDATES,
    V14_UNTRAINABLE,
    V15_RELEASE,
    V16_CANARY_ROUNDS,
    V17_EXPORT_QUEUE,
    V18_FEEDBACK_METRIC,
    V19_JUDGE_ATTEMPTS,
    V20_VERDICTS,
    V21_REBUILT_OWN_TRAJECTORIES,
]


def version(con: duckdb.DuckDBPyConnection) -> int:
    con.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = con.execute("SELECT max(version) FROM schema_version").fetchone()
    return row[0] or 0


def migrate(con: duckdb.DuckDBPyConnection, migrations: list[str] = MIGRATIONS) -> int:
    """Bring the database up to `len(migrations)`; return the version it had before."""
    before = version(con)
    if before > len(migrations):
        raise RuntimeError(
            f"database schema version {before} is newer than this onjob ({len(migrations)})"
        )
    for target in range(before + 1, len(migrations) + 1):
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(migrations[target - 1])
            con.execute("INSERT INTO schema_version VALUES (?)", [target])
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
    return before
