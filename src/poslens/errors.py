"""One exception type for every user-facing error.

The CLI turns a :class:`PoslensError` into a single line on stderr and a non-zero exit, so the
message must name the bad input and say what to do about it.
"""


class PoslensError(Exception):
    """A problem with the user's input or environment, explained in one line."""


def require(condition: bool, message: str) -> None:
    """Raise :class:`PoslensError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise PoslensError(message)


def require_positive(*options: tuple[str, int]) -> None:
    """Raise :class:`PoslensError` for the first ``(flag, value)`` pair whose value is below 1."""
    for flag, value in options:
        if value < 1:
            raise PoslensError(f"{flag} {value}: must be a positive integer.")
