"""onjob's benchmarks, by room: each runs from the repository root as
`python -m bench.<room>.<name> [options]` and writes its result under bench/results/
through `bench.harness`. bench/README.md lists what each answers."""
