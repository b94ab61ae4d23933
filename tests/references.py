"""The one set of brute-force references for the neighbourhood metrics (arXiv 2501.00073), shared by
``tests/test_references.py``, ``tests/metrics/test_neighborhood_metrics.py`` and the neighbourhood
analysis' tests: plain Python loops over nested lists, never poslens code.

APS = #{(j, k, i): j < k < i, S[i, k] > S[i, j]} / #{such triples}.
"""

import math


def finite(v) -> bool:
    return not (math.isnan(v) or math.isinf(v))


def brute_rising(m, include_diagonal=False, ties=0.0):
    """Fraction of triples j < k < i (k <= i with the diagonal) with ``m[i][k] > m[i][j]``, a tie
    counting ``ties``; pairs with a NaN or infinite entry are skipped (NaN when none is left)."""
    T = len(m)
    hits = total = 0.0
    for i in range(T):
        last = i if include_diagonal else i - 1
        for j in range(T):
            for k in range(j + 1, last + 1):
                a, b = m[i][j], m[i][k]
                if not (finite(a) and finite(b)):
                    continue
                total += 1
                hits += 1.0 if b > a else (ties if b == a else 0.0)
    return hits / total if total else float("nan")


def brute_aps(m):
    """The paper's APS of one map: strict rises only, the main diagonal left out."""
    return brute_rising(m, include_diagonal=False, ties=0.0)


def brute_cos(rows):
    """Self-cosine map of vectors ``rows`` (nested lists); 0 where either vector is zero."""
    n = [math.sqrt(sum(v * v for v in r)) for r in rows]
    return [[(sum(a * b for a, b in zip(r, s)) / (n[i] * n[j])) if n[i] and n[j] else 0.0
             for j, s in enumerate(rows)] for i, r in enumerate(rows)]


def brute_cos_aps(x):
    """Per-sequence APS of the self-cosine map of ``x [S, D]`` (a tensor or nested lists)."""
    return brute_aps(brute_cos(x.tolist() if hasattr(x, "tolist") else x))


def brute_sink_heads(attentions):
    """``[L][H][S]``: the mean over sequences of each head's weight on key 0, ``A[b, h, i, 0]``, from the
    per-layer attention weights ``[B, H, S, S]`` (tensors or nested lists) by plain loops."""
    out = []
    for a in attentions:
        a = a.tolist() if hasattr(a, "tolist") else a
        B, H, S = len(a), len(a[0]), len(a[0][0])
        out.append([[sum(a[b][h][i][0] for b in range(B)) / B for i in range(S)] for h in range(H)])
    return out
