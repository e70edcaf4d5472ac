"""Errors that carry a user-facing message and an exit code (never a traceback)."""


class TrainbaseError(Exception):
    """Bad input or a refused operation. `build.py` prints the message and exits with `code`."""

    code = 2

    def __init__(self, message: str, *, cell: str | None = None):
        self.cell = cell
        super().__init__(f"{cell}: {message}" if cell else message)


class MatrixError(TrainbaseError):
    """matrix.yaml is malformed, inconsistent, or a selection matches nothing."""


class TemplateError(TrainbaseError):
    """A template failed to render (the message names the template and line)."""
