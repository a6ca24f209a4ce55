"""What DuckDB keeps between loads (`Store.release_memory`, store.py's docstring): not its
cache of the file, not the stale eviction-queue entries each unpinned buffer leaves (a
malloc'd block record each, outside `memory_limit`), and never a changed limit."""

from __future__ import annotations

import time

from onjob.collector import Store
from onjob.collector.records import ExchangeRecord, encode, to_json


def segment(tmp_path, n: int, rows: int = 20):
    path = tmp_path / f"{n:012d}-test.jsonl"
    lines = [
        encode(
            ExchangeRecord(
                id=f"chatcmpl-{n}-{i}",
                ts=time.time(),
                trajectory_id=f"traj-{n}-{i}",
                turn=0,
                scenario_id="scn",
                scenario_key="key",
                scenario_keyed="derived",
                request=to_json({"messages": [{"role": "user", "content": f"{n} {i} " * 200}]}),
                prompt_token_ids=list(range(300)),
            )
        )
        for i in range(rows)
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def queued(store: Store) -> int:
    """Entries in DuckDB's eviction queues, stale ones included (0 where DuckDB does not
    list them: `duckdb_eviction_queues()` is new in 2.0)."""
    listed = store.con.execute(
        "SELECT count(*) FROM duckdb_functions() WHERE function_name = 'duckdb_eviction_queues'"
    ).fetchone()[0]
    if not listed:
        return 0
    return store.con.execute(
        "SELECT sum(approximate_size) FROM duckdb_eviction_queues()"
    ).fetchone()[0]


def cached(store: Store, tag: str) -> int:
    return store.con.execute(
        "SELECT memory_usage_bytes FROM duckdb_memory() WHERE tag = ?", [tag]
    ).fetchone()[0]


def limit(store: Store) -> str:
    return store.con.execute("SELECT current_setting('memory_limit')").fetchone()[0]


def test_many_small_loads_leave_neither_the_file_cached_nor_stale_queue_entries(tmp_path):
    store = Store(tmp_path / "db.duckdb", memory_limit="256MB")
    before = limit(store)
    for n in range(60):
        assert store.load_segment(segment(tmp_path, n)) == 20
    # Without release_memory: ~5,400 queue entries (~90 a load, nearly all stale) and the
    # whole file (11 blocks) in BASE_TABLE memory.
    assert queued(store) < 20
    used_blocks, block_size = store.con.execute(
        "SELECT used_blocks, block_size FROM pragma_database_size() "
        "WHERE database_name = current_database()"
    ).fetchone()
    assert used_blocks >= 8
    assert cached(store, "BASE_TABLE") <= 4 * block_size
    assert limit(store) == before == "244.1 MiB"
    assert store.dicts("SELECT count(*) AS n FROM exchanges") == [{"n": 1200}]
    assert store.dicts("SELECT count(*) AS n FROM trajectories") == [{"n": 1200}]


def test_with_nothing_pinned_the_limit_is_set_back_and_loading_goes_on(tmp_path):
    Store(tmp_path / "db.duckdb", memory_limit="256MB").close()
    store = Store(tmp_path / "db.duckdb", memory_limit="256MB")  # nothing loaded in it yet
    assert store.release_memory()  # DuckDB accepts one byte here; the limit follows at once
    assert limit(store) == "244.1 MiB"
    assert store.load_segment(segment(tmp_path, 0)) == 20


def test_the_default_limit_is_kept_too(tmp_path):
    store = Store(tmp_path / "db.duckdb")
    before = limit(store)
    store.load_segment(segment(tmp_path, 0))
    assert limit(store) == before


def test_no_eviction_while_a_users_query_runs(tmp_path):
    store = Store(tmp_path / "db.duckdb")
    store.load_segment(segment(tmp_path, 0))
    cursor = store.cursor()

    def query(cur):
        # `Collector.read` runs this on its readers' thread; a load finishing meanwhile
        # leaves the limit alone.
        assert not store.release_memory()
        return cur.execute("SELECT count(*) FROM exchanges").fetchone()[0]

    assert store.read(query, cursor) == 20
    assert store.release_memory()
