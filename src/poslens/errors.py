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
    """Raise :class:`PoslensError` for the first ``(flag, value)`` pair whose value is below 1, or, for a
    count of work (sequences, samples, batch rows, layers; not an interval such as ``--checkpoint-every``),
    above :func:`count_bound`: refused before anything is allocated or written."""
    for flag, value in options:
        if value < 1:
            raise PoslensError(f"{flag} {value}: must be a positive integer.")
        if "every" not in flag and "positions" not in flag:
            require_fits(flag, value)


def count_bound(flag: str) -> int:
    """The largest value count ``flag`` may take (:data:`poslens.conventions.MAX_SEQ_LEN` for a sequence
    length, else :data:`poslens.conventions.MAX_COUNT`)."""
    from poslens.conventions import MAX_COUNT, MAX_SEQ_LEN

    return MAX_SEQ_LEN if "len" in flag else MAX_COUNT


def require_fits(flag: str, value: int) -> None:
    """Refuse a count whose work or memory cannot fit, in one line naming the input and the bound."""
    most = count_bound(flag)
    if value > most:
        raise PoslensError(f"{flag} {value}: too large; at most {most:,} (the work and memory of more cannot fit).")


class Interrupted(PoslensError):
    """A long command stopped by Ctrl-C or SIGTERM after saving what it can; the message says what
    was kept and how to continue (the CLI prints ``poslens: interrupted: ...``, exit 130 or 143)."""


class PoslensWarning(UserWarning):
    """A warning poslens shows as one line (``poslens: warning: ...``) when run from the CLI."""


def one_line_warnings(format_warning=None):
    """A ``warnings.formatwarning`` that shows :class:`PoslensWarning` as one ``poslens: warning:`` line
    and every other warning as ``format_warning`` (default: the current one) does. The CLI installs it
    for its process; the library never does (importing poslens changes no warning hook)."""
    import warnings

    previous = format_warning or warnings.formatwarning

    def _one_line(message, category, filename, lineno, line=None):
        if issubclass(category, PoslensWarning):
            return f"poslens: warning: {message}\n"
        return previous(message, category, filename, lineno, line)

    return _one_line
