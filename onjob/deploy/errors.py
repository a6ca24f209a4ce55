"""The release machinery's errors: one tree, so a caller catches `DeployError` for what
deploy refuses or could not do, and anything else is a bug with its traceback."""

from __future__ import annotations

from ..errors import OnjobError


class DeployError(OnjobError):
    """A release step refused or could not be done; the message says why."""


class RoutingChanged(DeployError):
    """The routing a decision was made on is no longer the current one."""


class UnknownCheckpoint(DeployError):
    """A name that is neither in the checkpoints table nor served by the engine."""


class NothingToJudge(DeployError):
    """No scorer is configured (judge.model, [judge.rewards] or [loop.gate])."""


class TrainingFailed(DeployError):
    """The training child exited with a failure (diverged, crashed): no checkpoint."""


class RegistryError(DeployError):
    """A checkpoint that cannot be registered (not a LoRA adapter vLLM serves, a name taken)."""


class LoopOff(DeployError):
    """The loop cannot be paused or resumed: it is off in this server (interval 0)."""


class EngineControlError(DeployError):
    """The engine refused or failed an adapter load or unload, or its model list."""


class AdapterPathUnreadable(EngineControlError):
    """The engine has no adapter at the checkpoint's path (another host's disk)."""


class EngineUnreachable(EngineControlError):
    """No connection to the engine (down, or restarting): it can be loaded when it is back."""


class LineageBusy(DeployError):
    """Another worker holds the lineage's work now (a lake's lease, `collector/jobs.py`)."""

    def __init__(self, lineage: str, holder: str) -> None:
        self.lineage, self.holder = lineage, holder
        super().__init__(
            f"{holder} works lineage {lineage} now (its release decisions are that worker's "
            "until its job ends); try again then"
        )


class LineageLost(DeployError):
    """This worker's hold on a lineage ended mid-job (not renewed within its lease): the
    job stopped before deciding anything another worker may decide now."""
