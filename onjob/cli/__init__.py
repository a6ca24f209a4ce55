"""The `onjob` command line and the composition root: it reads the settings (flags, the
environment, the TOML file), builds each package's parts from them and wires them into
processes (`onjob serve`, `onjob engine`, the trainer's child). Nothing imports `cli`.

What each module holds:

the parser (`main.py`, which sets umask 0077: what onjob writes is its owner's alone,
and turns a command's `CliError` into its message on stderr and its exit code), the one
exit-code table (`exits.py`, printed by `onjob --help`, in `docs/cli.md`), what every
command shares (`common.py`: `--config`/`--db`/`--server`/`--admin-key` declared once as
parent parsers, the settings read once, one call of the running server's admin API and
one reading of its refusals, one way of saying that neither a server nor a database was
found) and one module per group of verbs: `serving.py` (engine, serve), `learning.py`
(judge, train, loop), `release.py` (checkpoints, compare, canary, promote, rollback,
status), `data.py` (forget, sql, export: through the admin API, or the file itself with
`--db`), `model.py` (model prepare, demo), `doctor.py` (`onjob doctor`: what a running
engine lacks that onjob needs: runtime LoRA, token ids and logprobs, tools, a streamed
strict tool, reasoning, a long context); the composed settings (`settings.py`:
`ServeSettings` = `DeploySettings` + telemetry + the child engine, read from flags,
`ONJOB_*` and TOML; a nested variable or a file key naming no setting refused, any other
`ONJOB_` variable no setting reads warned about with the spelling it probably meant),
the server's wiring (`server.py`), the admin key a server with none configured makes at
its first start and the other commands read (`admin_key.py`), `--workers`: the
proxy-only processes on the same port, started again when one dies (`workers.py`), how
it stops on SIGTERM (`stopping.py`), the engine child started again when it dies, with
back-off and a limit past which the server exits 1 (`supervisor.py`), the deadlines on a
client's request headers and body and the client connection limit (`deadlines.py`),
child processes (`process.py`: each leads a process group, which `stop` and `kill` end,
so vLLM's engine core and worker go with its API server), telemetry set-up
(`telemetry.py`), the settings reference generator (`reference.py`)
"""

from .main import main

__all__ = ["main"]
