"""Errors the lab raises on purpose, in a module of their own so that any room can raise them
without importing another (``rundir`` and the recipes both raise ``UsageError``)."""


class UsageError(Exception):
    """Bad input from the user: train.py prints it as one line and exits with code 2."""


class Diverged(Exception):
    """The loss or the gradient norm became NaN or infinite: printed as one line, exit code 3."""
