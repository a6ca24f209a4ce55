"""The trainer's exception tree."""


class TrainerError(Exception):
    pass


class NothingToTrain(TrainerError):
    """The snapshot holds no group with a spread of rewards: said, not silently skipped."""


class Diverged(TrainerError):
    """The loss or the gradient became NaN or infinite: no checkpoint is written."""
