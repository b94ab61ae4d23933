"""Which capture takes an attention call: the captures active in this context, innermost last."""

from __future__ import annotations

import contextvars

#: The captures active in this context, innermost last (``()``: plain SDPA). A context variable, not
#: a module global: a thread (or asyncio task) sees only the captures it activated itself, and a
#: capture bound to one model's attention modules never sees another model's calls.
ACTIVE: contextvars.ContextVar[tuple] = contextvars.ContextVar("poslens_active_captures", default=())


def active_capture(module=None):
    """The capture that takes ``module``'s attention calls here: the innermost active one bound to
    ``module`` (or bound to no model), else None."""
    for cap in reversed(ACTIVE.get()):
        if cap.owns(module):
            return cap
    return None
