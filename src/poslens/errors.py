"""One exception type for every user-facing error.

The CLI turns a :class:`PoslensError` into a single line on stderr and a non-zero exit, so the
message must name the bad input and say what to do about it.
"""


import re


class PoslensError(Exception):
    """A problem with the user's input or environment, explained in one line."""

    def cli(self) -> str:
        """The message as the CLI prints it (the same as ``str()``, except for an :class:`OptionError`)."""
        return str(self)


#: ``{name}``, ``{name=VALUE}`` or ``{name!}`` in an :class:`OptionError`'s text: an option, spelled by the face
_REF = re.compile(r"\{([a-z][a-z0-9_]*)(=[^{}]*|!)?\}")


class OptionError(PoslensError):
    """A bad option value, carrying both of its spellings: the CLI's flag (``--seq-len 0``) and Python's
    keyword (``seq_len=0``). ``str()`` is Python's face (the keyword); :meth:`cli` is the CLI's (the flag).

    ``flag``: the option's flag (``--seq-len``); ``keyword``: its keyword, by default the flag's name with
    ``_`` for ``-`` (``seq_len``). ``problem``: what is wrong and the fix; other options it names are
    written ``{name}`` (``--name`` / ``name``), ``{name=V}`` (``--name V`` / ``name=V``) or ``{name!}``
    (a switch: ``--name`` / ``name=True``), each spelled by the face that prints it. ``flags``: the flag
    of a named option whose flag is not ``--`` + its keyword with ``-`` for ``_``. ``shown``: the value
    as the CLI shows it (default: the text typed, ``repr`` for a string). ``sep``: between the option and
    the problem (``" "`` where the problem goes on the sentence: ``--seq-len 9000 exceeds ...``)."""

    def __init__(self, flag: str, value, problem: str, *, keyword: str | None = None,
                 flags: dict[str, str] | None = None, shown: str | None = None, sep: str = ": "):
        self.flag, self.value, self.problem, self.sep = flag, value, problem, sep
        self.keyword = keyword or flag.lstrip("-").replace("-", "_")
        self.flags = {self.keyword: flag, **(flags or {})}
        self.shown = shown if shown is not None else repr(value) if isinstance(value, str) else str(value)
        super().__init__(self._render(cli=False))

    def cli(self) -> str:
        return self._render(cli=True)

    def _render(self, *, cli: bool) -> str:
        def ref(m: re.Match) -> str:
            name, tail = m.group(1), m.group(2) or ""
            if cli:
                flag = self.flags.get(name, "--" + name.replace("_", "-"))
                return flag + (" " + tail[1:] if tail.startswith("=") else "")
            return name + ("=True" if tail == "!" else tail)

        head = f"{self.flag} {self.shown}" if cli else f"{self.keyword}={self.value!r}"
        return f"{head}{self.sep}{_REF.sub(ref, self.problem)}"


def require(condition: bool, message: str) -> None:
    """Raise :class:`PoslensError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise PoslensError(message)


def require_positive(*options: tuple) -> None:
    """Raise :class:`OptionError` for the first ``(flag, value)`` or ``(flag, value, keyword)`` whose value
    is below 1 (``str()`` names the keyword, ``seq_len=0``; the CLI the flag, ``--seq-len 0``), or, for a
    count of work (sequences, samples, batch rows, layers; not an interval such as ``--checkpoint-every``),
    above :func:`count_bound`: refused before anything is allocated or written."""
    for flag, value, *keyword in options:
        kw = keyword[0] if keyword else None
        if value < 1:
            raise OptionError(flag, value, "must be a positive integer.", keyword=kw)
        if "every" not in flag and "positions" not in flag:
            require_fits(flag, value, kw)


def count_bound(flag: str) -> int:
    """The largest value count ``flag`` may take (:data:`poslens.conventions.MAX_SEQ_LEN` for a sequence
    length, else :data:`poslens.conventions.MAX_COUNT`)."""
    from poslens.conventions import MAX_COUNT, MAX_SEQ_LEN

    return MAX_SEQ_LEN if "len" in flag else MAX_COUNT


def require_fits(flag: str, value: int, keyword: str | None = None) -> None:
    """Refuse a count whose work or memory cannot fit, in one line naming the input and the bound."""
    most = count_bound(flag)
    if value > most:
        raise OptionError(flag, value, f"too large; at most {most:,} (the work and memory of more cannot fit).",
                          keyword=keyword)


class Interrupted(PoslensError):
    """A long command stopped by Ctrl-C or SIGTERM after saving what it can; the message says what
    was kept and how to continue (the CLI prints ``poslens: interrupted: ...``, exit 130 or 143)."""


class Resumable(PoslensError):
    """A run that failed with its checkpoints intact (another rank of a distributed scan was lost): the
    message says how to continue (``--resume``), and a new ``--out`` is kept for it, not emptied."""


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
