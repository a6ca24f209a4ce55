"""The trainer's exception tree (torch's, pyarrow's and the file system's errors become
these in `foreign.py`, once: this module stays importable without torch)."""

from ..errors import OnjobError


class TrainerError(OnjobError):
    pass


class NothingToTrain(TrainerError):
    """The snapshot holds no group with a spread of rewards: said, not silently skipped."""


class OverBudget(NothingToTrain):
    """No step stayed within the run's KL budget, or its start was already past it: nothing
    is written, and the groups are recorded as used, as for any run with nothing to train."""


class Diverged(TrainerError):
    """The loss or the gradient became NaN or infinite: no checkpoint is written."""


class UnsupportedModel(TrainerError):
    """The model's forward does something the trainer's logprobs would not reproduce."""


class BadTargets(TrainerError):
    """A configured LoRA target matches no layer of the model (it would be silently untrained)."""


class ParentMismatch(TrainerError):
    """The adapter continued from differs from the settings (rank, alpha or targets), which
    peft would silently ignore."""


class NoDevice(TrainerError):
    """The settings ask for a device this machine does not have."""


class IOFailed(TrainerError):
    """A file of the run (the snapshot, the base model, the parent adapter, the checkpoint
    written) could not be read or written."""


class OutOfMemory(TrainerError):
    """The device ran out of memory during the run: no checkpoint is written."""
