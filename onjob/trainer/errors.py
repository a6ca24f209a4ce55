"""The trainer's exception tree."""


class TrainerError(Exception):
    pass


class NothingToTrain(TrainerError):
    """The snapshot holds no group with a spread of rewards: said, not silently skipped."""


class Diverged(TrainerError):
    """The loss or the gradient became NaN or infinite: no checkpoint is written."""


class UnsupportedModel(TrainerError):
    """The model's forward does something the trainer's logprobs would not reproduce."""


class BadTargets(TrainerError):
    """A configured LoRA target matches no layer of the model (it would be silently untrained)."""


class ParentMismatch(TrainerError):
    """The adapter continued from differs from the settings (rank, alpha or targets), which
    peft would silently ignore."""
