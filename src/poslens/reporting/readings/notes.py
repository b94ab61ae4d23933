"""Why a map carries no noise floor, in words: the codes of ``describe_map``'s ``noise``
(:data:`poslens.metrics.diagonal.NOISE_NOTES`), as the terminal and the readings say them; and the note
of a scan measured past the model's trained context (``--beyond-context``)."""

from __future__ import annotations

from poslens.conventions import NOISE_P
from poslens.metrics.diagonal import NO_GROUPS, NO_VALID_ENTRY, TOO_FEW_GROUPS
from poslens.metrics.noise import min_pvalue


def noise_note(code, groups=None) -> str:
    """The sentence of a ``noise`` code (``groups``: the record's ``noise_groups``); text a run holds
    instead of a code is returned as it is."""
    if code == NO_VALID_ENTRY:
        return "no valid entry (a map of one position, or every key excluded): no noise estimate"
    if code == NO_GROUPS:
        return ("no noise estimate: fewer than two independent groups of samples; add samples for p-values and "
                "noise floors")
    if code == TOO_FEW_GROUPS:
        g = int(groups) if isinstance(groups, (int, float)) and groups >= 2 else None
        few = f"only {g} independent groups of samples: the smallest attainable p-value is {min_pvalue(g):.3g}, " \
            if g is not None else "too few independent groups of samples: the smallest attainable p-value lies "
        return (few + f"above {NOISE_P:g}; p-values are given but nothing is called flat or significant "
                "(8 groups or more are needed)")
    return str(code)


def beyond_context_note(summary: dict) -> str | None:
    """The one note of a scan whose ``seq_len`` is past the model's trained context (the summary's
    ``beyond_context`` and ``trained_context``, ``--beyond-context``); None otherwise."""
    n, s = summary.get("trained_context"), summary.get("seq_len")
    if summary.get("beyond_context") is not True or not isinstance(n, int) or not isinstance(s, int):
        return None
    return f"Measured at {s:,} tokens, past the model's trained context of {n:,} tokens."
