"""The `onjob` command line and the composition root: it reads the settings (flags, the
environment, the TOML file), builds each package's parts from them and wires them into
processes (`onjob serve`, `onjob engine`, the trainer's child). Nothing imports `cli`."""

from .main import main

__all__ = ["main"]
