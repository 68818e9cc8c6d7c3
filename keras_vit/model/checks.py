"""Argument checks shared by the layers and the model: one clear ValueError each."""


def check_positive_int(value, what):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}.")


def check_rate(value, what):
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{what} must be in [0, 1), got {value!r}.")
