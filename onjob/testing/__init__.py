"""Fake engines for tests and benchmarks: no model, no accelerator, real processes.

- `fake_upstream`: a fast fake engine (canned OpenAI answers, logprobs, token ids and
  usage); `python -m onjob.testing.fake_upstream --port N [--delay-ms D]`.
- `faulty_upstream`: a fake engine that errs, stalls, drops and cuts answers on a seeded
  schedule (`FaultyEngine` runs it as a process); `python -m onjob.testing.faulty_upstream
  --port N [--fault-rate R ...]`.
- `faults`: load through `onjob serve` in front of the faulty engine, every answer
  classified and checked against DuckDB (the fault and crash tests, the fault and soak
  benches). Needs aiohttp (the dev extra).
- `postgres`: a throwaway Postgres cluster on a free port (Debian's package), a DuckLake
  catalog's server for the lake tests and benches.
- `lake_writer`: a host committing its own batches into a DuckLake, as a process
  (`python -m onjob.testing.lake_writer CATALOG DATA_PATH HOST --batches N`).
- `lake_worker`: a worker claiming and renewing lineages' leases in a DuckLake, as a
  process (`python -m onjob.testing.lake_worker CATALOG DATA_PATH HOLDER LINEAGE...`).

Nothing in the product imports this package (import-linter's contracts say so).
"""
