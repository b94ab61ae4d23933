"""Neighbourhood metrics of self-similarity maps (arXiv 2501.00073).

The adjacency probability score (APS) counts, over all position triples j < k < i, how often
query row i is more similar to the nearer key k than to the farther key j:
``APS = #{(j, k, i): j < k < i, S[i, k] > S[i, j]} / C(T, 3)``; 1 = every row rises
monotonically towards the diagonal, 0.5 = chance. The paper computes it per sequence and reports
the mean and standard deviation over sequences; the APS of a map *averaged over sequences* is a
different number (it tends to 1 for any consistent weak trend as sequences are added).
"""

from __future__ import annotations

import numpy as np
import torch

from poslens import native
from poslens.theory import running_mean_cosine
from poslens.metrics.ties import tie_columns


def aps_positions(S: int, max_positions: int, device=None) -> torch.Tensor:
    """The positions an APS is computed on when a sequence is longer than ``max_positions``:
    ``max_positions`` evenly spaced positions from 0 to S - 1 (rounded), else all of them (on
    ``device``, the CPU by default)."""
    if S <= max_positions:
        return torch.arange(S, device=device)
    return torch.linspace(0, S - 1, max_positions, device=device).round().long()


def rising_pair_fraction(m, include_diagonal: bool = False, ties: float = 0.0, chunk_elems: int = 2**24) -> torch.Tensor:
    """Fraction of same-row key pairs (j < k, both visible to row i) where ``m[i, k] > m[i, j]``.

    Visible means ``k < i`` (or ``k <= i`` with ``include_diagonal``) and a finite entry: NaN
    entries (masked keys, such as an excluded sink column) take part in no pair. Works on
    ``[..., T, T]`` and returns ``[...]`` (NaN when no pair is left). Ties count ``ties`` (0 as in
    the APS definition, 0.5 for a symmetric trend measure). The pairs are counted by
    :func:`pair_counts`.
    """
    return pair_fraction(*pair_counts(m, include_diagonal, chunk_elems), ties)


def pair_fraction(rises: torch.Tensor, tied: torch.Tensor, total: torch.Tensor, ties: float = 0.0) -> torch.Tensor:
    """``(rises + ties * tied) / total`` of counts from :func:`pair_counts` (NaN where ``total`` is 0)."""
    hits = rises + ties * tied
    return hits / total.clamp_min(1) + torch.where(total > 0, 0.0, float("nan")).to(hits.device)


def pair_counts(m, include_diagonal: bool = False, chunk_elems: int = 2**24) -> tuple[torch.Tensor, torch.Tensor,
                                                                                    torch.Tensor]:
    """``(rising, tied, pairs)`` over the same-row pairs of visible keys of maps ``m [..., T, T]``
    (float64 ``[...]`` each; see :func:`rising_pair_fraction`). On the CPU by sorting each row
    (:func:`row_pair_counts`, O(T^2 log^2 T) per map); on other devices every pair is compared, in
    row blocks of at most ``chunk_elems`` comparisons (O(T^3) per map, a few large kernels per block
    where many small sorts would be launch-bound)."""
    m = torch.as_tensor(m)
    m = m.to(torch.float64) if not m.is_floating_point() else m
    if m.device.type == "cpu":
        return row_pair_counts(m, include_diagonal)
    return _compared_pair_counts(m, include_diagonal, chunk_elems)


def _compared_pair_counts(m: torch.Tensor, include_diagonal: bool,
                          chunk_elems: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`pair_counts` by comparing every visible pair of each row."""
    T = m.shape[-1]
    lead = m.shape[:-2]
    flat = m.reshape(-1, T, T)
    B = flat.shape[0]
    rises, tied, total = (torch.zeros(B, dtype=torch.float64, device=m.device) for _ in range(3))
    jj = torch.arange(T, device=m.device)
    pair_upper = jj[:, None] < jj[None, :]  # j < k
    rows_per_chunk = max(1, chunk_elems // max(1, B * T * T))
    extra = 1 if include_diagonal else 0
    for start in range(0, T, rows_per_chunk):
        stop = min(T, start + rows_per_chunk)
        K = min(T, stop - 1 + extra)  # keys the block's last row sees
        if K < 2:
            continue
        rows = torch.arange(start, stop, device=m.device)
        vis = jj[None, :K] < (rows + extra)[:, None]  # [R, K]
        r = flat[:, start:stop, :K]  # [B, R, K]
        ok = torch.isfinite(r) & vis[None]
        valid = ok[:, :, :, None] & ok[:, :, None, :] & pair_upper[None, None, :K, :K]  # [B, R, j, k]
        rises += ((r[:, :, None, :] > r[:, :, :, None]) & valid).sum(dim=(1, 2, 3), dtype=torch.float64)
        tied += ((r[:, :, None, :] == r[:, :, :, None]) & valid).sum(dim=(1, 2, 3), dtype=torch.float64)
        total += valid.sum(dim=(1, 2, 3), dtype=torch.float64)
    return rises.reshape(lead), tied.reshape(lead), total.reshape(lead)


def finite(x: torch.Tensor) -> torch.Tensor:
    """``torch.isfinite(x)`` as ``|x| < inf`` (False for NaN and both infinities), about twice as fast
    as ``isfinite`` on float64 here."""
    if not x.is_floating_point():
        return torch.ones_like(x, dtype=torch.bool)
    return x.abs() < float("inf")


def finite_prefix(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``x [..., T]`` with the entries where ``keep`` (bool, same shape) moved to the front of each row
    in their order, and ``-inf`` after them: the layout :func:`ordered_pair_counts` counts. Where the
    kept entries of every row already are its first ones, only the rest is set to ``-inf``."""
    T = x.shape[-1]
    if T < 2 or not bool((keep[..., 1:] & ~keep[..., :-1]).any()):  # no kept entry after a dropped one
        return x.masked_fill(~keep, float("-inf"))
    pos = keep.cumsum(-1, dtype=torch.int64) - 1
    spare = torch.full((), T, dtype=torch.int64, device=x.device)  # dropped entries go to one spare column
    pos = torch.where(keep, pos, spare)
    out = x.new_full((*x.shape[:-1], T + 1), float("-inf"))
    out.scatter_(-1, pos, x)
    return out[..., :T]


def dead_leading_keys(visible: torch.Tensor) -> int:
    """How many first key columns of ``visible [B, T, T]`` (rows: queries, columns: keys) no row of any
    map sees: with them gone (``m[..., c:, c:]``), row ``i`` still sees the keys before it (an
    excluded sink column 0 leaves every row's visible keys a prefix again)."""
    dead = ~visible.any(1).any(0)
    return int(torch.cumprod(dead.to(torch.int64), 0).sum())


#: narrowest column prefix the rows of a map are counted on (:func:`row_pair_counts`,
#: :func:`_rising_pairs_by_merge`): the first 65 rows in one call, because per-call costs outweigh the
#: work saved by narrower prefixes of 2, 4, .., 64 columns
_MIN_PREFIX = 64


def prefix_bands(T: int, extra: int = 0):
    """``(lo, hi, w)``: bands of rows ``lo .. hi - 1`` of ``T`` rows, where row ``i`` has at most
    ``i + extra`` entries, each at most ``w`` (a power of two from :data:`_MIN_PREFIX`, or ``T``):
    the rows of a band are counted on their first ``w`` columns only."""
    lo = 0
    while lo < T:
        w = min(T, max(_MIN_PREFIX, 1 << max(1, lo.bit_length())))
        hi = T if w == T else w + 1 - extra
        yield lo, hi, w
        lo = hi


def row_pair_counts(m: torch.Tensor, include_diagonal: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For maps ``m [..., T, T]`` (CPU): ``(rising, tied, pairs)``, float64 ``[...]`` each, over the
    same-row pairs of visible keys ``j < k`` (``k < i``, or ``k <= i`` with ``include_diagonal``, both
    entries finite): pairs with ``m[i, k] > m[i, j]``, with ``m[i, k] == m[i, j]``, and all of them.

    Each row's visible entries are moved to its front (:func:`finite_prefix`, after the key columns no
    row sees: :func:`dead_leading_keys`) and counted by one value sort per row
    (:func:`_sorted_pair_counts`), rows that see at most ``w`` keys on their first ``w`` columns only.
    The counts are exact integers (in float64 up to 2^53)."""
    m = torch.as_tensor(m)
    m = m.to(torch.float64) if not m.is_floating_point() else m
    T = m.shape[-1]
    lead = m.shape[:-2]
    flat = m.reshape(-1, T, T)
    B = flat.shape[0]
    extra = 1 if include_diagonal else 0
    i = torch.arange(T, device=m.device)
    vis = (i[None, :] < i[:, None] + extra) & finite(flat)  # [B, row, key]
    c = dead_leading_keys(vis)
    if c:  # keys no row sees (an excluded column 0): the rows before them see nothing either
        flat, vis, T = flat[:, c:, c:], vis[:, c:, c:], T - c
    x = finite_prefix(flat, vis)
    n = vis.sum(-1, dtype=torch.int64)
    rises = torch.zeros(B, dtype=torch.int64, device=m.device)
    tied = torch.zeros_like(rises)
    for lo, hi, w in prefix_bands(T, extra):
        if w < 2:
            continue
        gt, eq = _sorted_pair_counts(x[:, lo:hi, :w].reshape(-1, w))
        rises += gt.reshape(B, hi - lo).sum(1)
        tied += eq.reshape(B, hi - lo).sum(1)
    pairs = (n * (n - 1) // 2).sum(1)
    as64 = torch.float64
    return rises.to(as64).reshape(lead), tied.to(as64).reshape(lead), pairs.to(as64).reshape(lead)


def key_pair_counts(m: torch.Tensor, keys, include_diagonal: bool = False) -> tuple[torch.Tensor, torch.Tensor,
                                                                                    torch.Tensor]:
    """The pairs :func:`row_pair_counts` counts in ``m [..., T, T]`` that involve a key column in ``keys``
    (one or both keys of the pair): ``(rising, tied, pairs)``, float64 ``[...]`` each. Added to the
    counts of ``m`` with those columns masked (NaN) they give the counts of ``m`` itself: each such
    column compared with every other visible finite key of its row, O(T^2) per key column."""
    m = torch.as_tensor(m)
    m = m.to(torch.float64) if not m.is_floating_point() else m
    T = m.shape[-1]
    keys = sorted({int(k) for k in keys if 0 <= k < T})
    i = torch.arange(T, device=m.device)
    vis = (i[None, :] < i[:, None] + (1 if include_diagonal else 0)) & finite(m)  # [..., row, key]
    in_keys = torch.zeros(T, dtype=torch.bool, device=m.device)
    in_keys[keys] = True
    counts = [torch.zeros(m.shape[:-2], dtype=torch.int64, device=m.device) for _ in range(3)]
    for e in keys:
        col = m[..., :, e:e + 1]  # [..., row, 1]
        # partners k of key e: visible, finite, and not a key of `keys` before e (that pair is e's partner's)
        partner = vis & vis[..., :, e:e + 1] & (~in_keys | (i > e))[None, :] & (i != e)[None, :]
        rises = torch.where(i[None, :] > e, m > col, col > m)  # the later key's entry higher
        counts[0] += (rises & partner).sum((-1, -2))
        counts[1] += ((m == col) & partner).sum((-1, -2))
        counts[2] += partner.sum((-1, -2))
    return tuple(c.to(torch.float64) for c in counts)


#: block half-size up to which the rising count compares all pairs directly (b^2 comparisons per
#: block) instead of a sort and a binary search per element: beyond b = 1 the quadratic comparisons
#: cost more than the sort they save (the counts are the same either way)
_DIRECT_BLOCK = 1


def ordered_pair_counts(x: torch.Tensor, count_ties: bool = True) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """For each row of ``x [N, T]`` whose finite entries form a prefix (the rest -inf): the number of
    pairs j < k of finite entries with ``x[k] > x[j]`` (rising), with ``x[k] == x[j]`` (tied), and the
    number of such pairs in all, float64 ``[N]`` each. O(T log^2 T) per row instead of O(T^2).

    On the CPU: one value sort per row (:func:`_sorted_pair_counts`). Elsewhere the rows are padded to
    a power of two with -inf, and for block sizes b = 1, 2, 4, ... each finite element of a block's
    right half counts the elements of its left half that are smaller (sorted left half,
    ``searchsorted``) or equal: every pair j < k is counted at exactly one level, the one where j and
    k first fall into different halves. A -inf suffix takes part in no pair. ``count_ties=False``
    skips the tie count and returns None in its place.
    """
    if x.device.type == "cpu":
        gt, eq = _sorted_pair_counts(x) if count_ties else (rising_pair_counts(x), None)
        n = finite(x).sum(1).to(torch.float64)
        return gt.to(torch.float64), None if eq is None else eq.to(torch.float64), n * (n - 1) / 2
    return _merged_pair_counts(x, count_ties)


def _merged_pair_counts(x: torch.Tensor, count_ties: bool = True) -> tuple[torch.Tensor, torch.Tensor | None,
                                                                            torch.Tensor]:
    """:func:`ordered_pair_counts` by sorted block halves and ``searchsorted``, level by level (the
    path off the CPU, in a few kernels per level on any device)."""
    N, T = x.shape
    P = 1 << max(1, (T - 1).bit_length())
    if P != T:
        x = torch.cat([x, torch.full((N, P - T), float("-inf"), dtype=x.dtype, device=x.device)], dim=1)
    fin = torch.isfinite(x)
    gt = torch.zeros(N, dtype=torch.float64, device=x.device)
    ge = torch.zeros_like(gt)
    b = 1
    while b < P:
        blocks = x.reshape(N, P // (2 * b), 2 * b)
        if not count_ties and b <= _DIRECT_BLOCK:  # small blocks: compare every left/right pair at once
            gt += (blocks[..., None, b:] > blocks[..., :b, None]).sum(dim=(1, 2, 3), dtype=torch.float64)
            b *= 2
            continue
        left = blocks[..., :b].sort(dim=-1).values.contiguous()
        right = blocks[..., b:].contiguous()
        # a -inf right element finds no smaller left one (and a finite one has a finite left half,
        # the finite entries being a prefix): the rising count needs no mask
        gt += torch.searchsorted(left, right).sum(dim=(1, 2), dtype=torch.float64)
        if count_ties:
            live = fin.reshape(N, P // (2 * b), 2 * b)[..., b:]
            ge += (torch.searchsorted(left, right, right=True) * live).sum(dim=(1, 2), dtype=torch.float64)
        b *= 2
    n = fin.sum(1).to(torch.float64)
    return gt, (ge - gt) if count_ties else None, n * (n - 1) / 2


#: the float32 dtypes (and narrower, converted exactly) whose values :func:`_value_order` sorts as keys
_NARROW = (torch.float32, torch.float16, torch.bfloat16)


def _float32_order(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of each row of ``v [N, P]`` (float32, no NaN) in ascending order of value, equal values
    latest position first (int32), and each row's values' keys in that order (int32: equal values,
    equal keys). One sort of int64 keys: the value's bits mapped to an integer of the same order in
    the high word (``-0.0`` made ``+0.0`` first) and ``P - 1 - position`` in the low word."""
    P = v.shape[1]
    key = (v + np.float32(0.0)).view(np.int32).astype(np.int64)  # -0.0 + 0.0 = +0.0
    key ^= (key >> 31) & np.int64(0x7FFFFFFF)  # negative floats: reverse the order of the magnitude bits
    key <<= 32
    key |= np.arange(P - 1, -1, -1, dtype=np.int64)  # ties: the later position first
    key.sort(axis=1)
    order = key.astype(np.int32)  # the low word: P - 1 - position
    np.subtract(P - 1, order, out=order)
    return order, (key >> 32).astype(np.int32)


def _float32_key(value: float) -> int:
    """The high-word key :func:`_float32_order` gives ``value``."""
    k = int(np.array([value], dtype=np.float32).view(np.int32)[0])
    return k ^ (0x7FFFFFFF if k < 0 else 0)


_NEG_INF_KEY, _POS_INF_KEY = _float32_key(float("-inf")), _float32_key(float("inf"))


def _value_order(x: torch.Tensor, count_ties: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """Positions of each row of ``x [N, P]`` (CPU, no NaN) in ascending order of value, equal values in
    DESCENDING order of position (so a tied pair j < k is not a rise), as int32 ``[N, P]``; with
    ``count_ties``, also each row's pairs of equal values other than ``-inf`` (int64 ``[N]``).

    float32 (and narrower, converted exactly): :func:`_float32_order` (numpy's vectorised integer sort;
    ``torch.sort`` took about 5x as long here). float64 (integers: exactly): the same sort of the
    values rounded to float32, which keeps their order wherever rounding merges no two different
    values (rounding is monotonic): checked on every pair of neighbours in the order with equal keys,
    and on the infinities (no finite value beyond float32's range). The rows where it merges some
    are sorted again by a stable argsort of the reversed rows in float64 (about 3x as long).
    """
    P = x.shape[1]
    if x.dtype in _NARROW:
        order, keys = _float32_order(x.to(torch.float32).numpy())
        return order, _tied_runs(keys, skip=_NEG_INF_KEY) if count_ties else None
    v = x.to(torch.float64).numpy()
    with np.errstate(over="ignore"):  # beyond float32's range: an infinity, caught below
        v32 = v.astype(np.float32)
    order, keys = _float32_order(v32)
    same = keys[:, 1:] == keys[:, :-1]
    same &= (keys[:, 1:] != _NEG_INF_KEY) & (keys[:, 1:] != _POS_INF_KEY)
    redo = np.isinf(v32).sum(1) != np.isinf(v).sum(1)  # rows where a finite value rounded to an infinity
    if same.any():  # neighbours with one key: equal in float64 too?
        r, c = np.nonzero(same)
        redo[r[v[r, order[r, c]] != v[r, order[r, c + 1]]]] = True
    ties = _tied_runs(keys, skip=_NEG_INF_KEY) if count_ties else None
    if redo.any():  # those rows sorted in float64
        rows = np.nonzero(redo)[0]
        vr = v[rows]
        order[rows] = (P - 1) - np.argsort(vr[:, ::-1], axis=1, kind="stable")
        if count_ties:
            sv = np.take_along_axis(vr, order[rows].astype(np.int64), axis=1)
            ties[rows] = _tied_runs(sv, skip=float("-inf"))
    return order, ties


def _tied_runs(sk: np.ndarray, skip) -> np.ndarray:
    """Pairs of equal entries in each row of ``sk [N, P]`` (each row sorted ascending; entries equal to
    ``skip`` in no pair), int64 ``[N]``: each entry counts the equal ones sorted before it."""
    N, P = sk.shape
    new = np.ones(sk.shape, dtype=bool)
    np.not_equal(sk[:, 1:], sk[:, :-1], out=new[:, 1:])  # -0.0 == +0.0: one run
    if new[:, 1:].all() or not (~new[:, 1:] & (sk[:, 1:] != skip)).any():  # no tie (float maps, as a rule)
        return np.zeros(N, dtype=np.int64)
    idx = np.arange(P, dtype=np.int64)
    start = np.maximum.accumulate(np.where(new, idx, 0), axis=1)  # first index of each entry's run
    before = idx - start
    before[sk == skip] = 0
    return before.sum(1)


def _sorted_pair_counts(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each row of ``x [N, T]`` (CPU, no NaN; -inf entries only as a suffix): the pairs j < k with
    ``x[k] > x[j]`` and the pairs of equal finite entries, int64 ``[N]`` each. One value sort per row
    (:func:`_value_order`): the rising pairs are the non-inversions of the positions in value order
    (:func:`_noninversions`), the tied ones the runs of equal values. Rows of up to
    :data:`poslens.native.PAIR_COUNTS_MAX_T` entries: every pair compared in one vectorised C pass
    (:func:`poslens.native.pair_counts`), where the kernels are built."""
    N, T = x.shape
    if T < 2 or N == 0:
        zero = torch.zeros(N, dtype=torch.int64, device=x.device)
        return zero, zero.clone()
    fused = native.pair_counts(x)  # None for long rows, integers, or without the kernels
    if fused is None:  # long rows: a merge sort per row in C (None without the kernels)
        fused = native.merge_pair_counts(x) if x.is_floating_point() else None
    if fused is not None:
        return fused
    x = x.detach()
    if not x.is_floating_point():
        x = x.to(torch.float64)
    P = 1 << (T - 1).bit_length()
    if P != T:  # -inf padding: in no pair
        x = torch.cat([x, x.new_full((N, P - T), float("-inf"))], dim=1)
    order, tied = _value_order(x, count_ties=True)
    return torch.from_numpy(_noninversions(order)), torch.from_numpy(tied)


#: half-block sizes up to which :func:`_noninversions` compares left and right halves directly
#: (h^2 comparisons per block of 2h) instead of sorting the blocks: small blocks are cheaper to
#: compare than to sort, large ones the other way round
_DIRECT_HALF = 4


def _noninversions(seq: np.ndarray) -> np.ndarray:
    """Pairs ``a < b`` with ``seq[a] < seq[b]`` in each row of ``seq [N, P]`` (int32; each row a
    permutation of ``0 .. P - 1``, ``P`` a power of two) as int64 ``[N]``. O(P log^2 P) per row (a
    sort of blocks of ``2h`` entries at each of the ``log P`` levels), in numpy integer sorts.

    Every pair ``a < b`` falls into the two halves of exactly one block of ``2h`` entries (``h`` = 1,
    2, 4, ...). For small ``h`` the halves are compared directly. For larger ``h`` each block of keys
    ``2 seq + (1 for the right half)`` is sorted: a right-half entry's index in its sorted block counts
    the entries of the block smaller than it, the left-half ones it rises above plus the right-half
    ones, and the latter sum to ``h (h - 1) / 2`` per block (the right half's entries are distinct).
    """
    N, P = seq.shape
    total = np.zeros(N, dtype=np.int64)
    h = 1
    while h < P and h <= _DIRECT_HALF:
        b = seq.reshape(N, P // (2 * h), 2 * h)
        acc = np.zeros((N, P // (2 * h)), dtype=np.int16)
        for i in range(h):
            for j in range(h, 2 * h):
                acc += b[..., i] < b[..., j]
        total += acc.sum(axis=1, dtype=np.int64)
        h *= 2
    t = np.arange(P, dtype=np.int32)
    twice = seq << 1
    while h < P:
        k = twice | ((t // h) & 1)  # 2 seq + 1 in the right half of each block
        k = k.reshape(N, P // (2 * h), 2 * h)
        k.sort(axis=-1)
        k = k.reshape(N, P)
        k &= 1
        k *= t & (2 * h - 1)  # index in the sorted block, of the right-half entries
        total += k.sum(axis=1, dtype=np.int64) - (P // (2 * h)) * (h * (h - 1) // 2)
        h *= 2
    return total


#: comparisons per call of :func:`_direct_rising_counts` (a bool tensor of this many entries)
_DIRECT_ELEMS = 2**27


def _direct_rising_counts(x: torch.Tensor) -> torch.Tensor:
    """:func:`rising_pair_counts` by comparing every pair ``j < k`` of each row: O(T^2) per row in a
    few large kernels, for devices where the O(T log^2 T) count's many small sorts are launch-bound
    (a GPU: 256-position APS maps in about 3 kernels instead of several hundred)."""
    N, T = x.shape
    upper = torch.ones(T, T, dtype=torch.bool, device=x.device).triu_(1)  # [j, k]: j < k
    out = torch.empty(N, dtype=torch.int64, device=x.device)
    step = max(1, _DIRECT_ELEMS // max(1, T * T))
    for r0 in range(0, N, step):
        xs = x[r0:r0 + step]
        rise = (xs[:, None, :] > xs[:, :, None]).logical_and_(upper)  # [n, j, k]: x[k] > x[j], j < k
        out[r0:r0 + step] = rise.sum(dim=(1, 2))
    return out


def rising_pair_counts(x: torch.Tensor) -> torch.Tensor:
    """For each row of ``x [N, T]`` (no NaN): the number of pairs j < k with ``x[k] > x[j]``, int64 ``[N]``.

    Strict: ties do not count, and a ``-inf`` entry never rises above another (a -inf suffix takes part
    in no rising pair). One value sort and O(T log^2 T) integer work per row on the CPU (:func:`_value_order`, then
    :func:`_noninversions` of the positions in value order: a pair of positions j < k is a rise exactly
    when j comes first in value order), or for rows of up to :data:`poslens.native.PAIR_COUNTS_MAX_T`
    entries every pair compared in C (:func:`poslens.native.pair_counts`); elsewhere every pair compared
    on the device (:func:`_direct_rising_counts`).
    """
    N, T = x.shape
    if x.device.type != "cpu":
        return _direct_rising_counts(x)
    if T < 2:
        return torch.zeros(N, dtype=torch.int64, device=x.device)
    fused = native.pair_counts(x)  # short float rows: every pair in C
    if fused is not None:
        return fused[0]
    P = 1 << (T - 1).bit_length()
    if P != T:  # -inf padding: no rise with or among the added entries
        x = torch.cat([x, x.new_full((N, P - T), float("-inf"))], dim=1)
    return torch.from_numpy(_noninversions(_value_order(x.detach())[0]))


def _rising_pairs_by_merge(m: torch.Tensor) -> torch.Tensor:
    """``rising_pair_fraction(m, include_diagonal=False, ties=0)`` for maps ``[B, T, T]`` whose strict
    lower triangle is finite: row i's visible keys 0..i-1 are kept and every later column is set to
    -inf, then :func:`rising_pair_counts` counts its rising pairs."""
    B, T, _ = m.shape
    total = T * (T - 1) * (T - 2) / 6  # sum_i i (i - 1) / 2: pairs below the diagonal; > 0 for T >= 3
    fused = native.rising_pairs(m)  # None off the CPU, for other dtypes, or without the kernels
    if fused is not None:  # every pair compared in one vectorised pass (poslens.native)
        return fused.to(torch.float64) / total
    i = torch.arange(T, device=m.device)
    x = m.masked_fill(i[None, :] >= i[:, None], float("-inf"))
    if m.device.type != "cpu":  # one direct count of every row (the prefixes below save CPU work only)
        return _direct_rising_counts(x.reshape(-1, T)).reshape(B, T).sum(1).to(torch.float64) / total
    gt = torch.zeros(B, dtype=torch.int64, device=m.device)
    for lo, hi, w in prefix_bands(T):  # rows lo .. w see at most w keys: count them on their first w columns only
        rows = rising_pair_counts(x[:, lo:hi, :w].reshape(-1, w)).to(gt.device)
        gt += rows.reshape(B, hi - lo).sum(1)  # integer counts: exact
    return gt.to(torch.float64) / total


def adjacency_probability_score(sim) -> torch.Tensor:
    """APS of a self-similarity matrix ``[..., T, T]`` (arXiv 2501.00073); 1 = perfect adjacency.

    Applied to one sequence's map this is the paper's per-sequence APS; applied to a map averaged
    over sequences it is what poslens calls the *mean-map APS* (no chance level of 0.5 applies).
    Maps with a finite strict lower triangle are counted row by row in O(T log^2 T) per row
    (:func:`rising_pair_counts`, O(T^2 log^2 T) per map); others
    (masked entries) by :func:`rising_pair_fraction`.
    """
    m = torch.as_tensor(sim)
    m = m.to(torch.float64) if not m.is_floating_point() else m
    T = m.shape[-1]
    lead = m.shape[:-2]
    flat = m.reshape(-1, T, T)
    lower = torch.ones(T, T, dtype=torch.bool, device=m.device).tril(-1)
    # a map finite everywhere is finite below the diagonal (one pass, no gather: the common case)
    if T >= 3 and (bool(torch.isfinite(flat).all()) or bool(torch.isfinite(flat[:, lower]).all())):
        return _rising_pairs_by_merge(flat).reshape(lead)
    return rising_pair_fraction(m, include_diagonal=False, ties=0.0)


def per_sequence_aps(x: torch.Tensor, max_positions: int = 256, chunk_elems: int = 2**24) -> torch.Tensor:
    """The paper's APS of each sequence's self-cosine map: ``x [B, S, ...]`` -> ``[B]``.

    Trailing dimensions are flattened (concatenated head outputs); sequences longer than
    ``max_positions`` use :func:`aps_positions`. Cosines are taken in float32, of the rows scaled by
    their inverse norms (as the scan's cosine maps are: :func:`unit_rows_aps`).
    """
    B, S = x.shape[:2]
    idx = aps_positions(S, max_positions).to(x.device)
    v = x[:, idx].reshape(B, idx.numel(), -1).to(torch.float32)
    norm = torch.linalg.vector_norm(v, dim=-1, keepdim=True)
    u = v * norm.clamp_min(1e-30).reciprocal()
    return unit_rows_aps(u, finite=bool(torch.isfinite(norm).all()))


def unit_rows_aps(u: torch.Tensor, finite: bool = False) -> torch.Tensor:
    """APS of each sequence's cosine map from its unit rows ``u [B, T, d]`` (float32) -> ``[B]``.

    ``finite``: the caller knows every row's norm is finite, so every cosine is (the count then skips
    its finiteness pass over the maps)."""
    return lower_cosines_aps(lower_cosines(u), finite)


def lower_cosines_aps(m: torch.Tensor, finite: bool = False) -> torch.Tensor:
    """APS of each map of :func:`lower_cosines` (``[B, T, T]``) -> ``[B]``; ``finite`` as in
    :func:`unit_rows_aps`. ``m`` is read, not changed."""
    if finite and m.shape[-1] >= 3:
        return _rising_pairs_by_merge(m)
    return adjacency_probability_score(m)


def lower_cosines(u: torch.Tensor) -> torch.Tensor:
    """``u @ u^T`` per sequence (``u [B, T, d]``) where the APS reads it, the strict lower triangle:
    the rows of the first half against the first half's columns and the rows of the second half
    against every column (3/4 of the product); the block above the diagonal is 0.

    Batched general products, whose entries of one row all come from the same kernel in the same
    order, so identical vectors (a repeated token's embedding) get bitwise-equal cosines: exact ties,
    which the count does not take for rises. A symmetric rank-k product on two BLAS threads broke
    such ties in the last bit (its triangle blocks go to different kernels by thread), and SmolLM2's
    embedding-layer APS on the stdlib corpus came out about 1e-3 higher than on one thread. Within
    one product, a kernel's edge columns can still round differently: :func:`tie_columns` repairs them."""
    T = u.shape[1]
    if T < 64 or u.device.type != "cpu":
        m = torch.bmm(u, u.transpose(1, 2))
    else:
        h = T // 2
        m = torch.empty(u.shape[0], T, T, dtype=u.dtype, device=u.device)
        m[:, :h, h:] = 0.0
        torch.bmm(u[:, :h], u[:, :h].transpose(1, 2), out=m[:, :h, :h])
        torch.bmm(u[:, h:], u.transpose(1, 2), out=m[:, h:])
    # a BLAS may still treat a tile's edge columns with another kernel (MKL's AVX2 path does): the
    # columns of repeated vectors are made exact copies of their first one's (poslens.metrics.ties)
    return tie_columns(m, u)


#: comparisons per step of :func:`norm_score` (a bool tensor of this many entries)
_NORM_SCORE_ELEMS = 2**24


def norm_score(norms) -> torch.Tensor:
    """The same triple count applied to ``-||h_i||``: 1 when norms shrink monotonically with position.

    ``norms`` is ``[..., T]``. Each pair j < k is counted once for every later row i > k, as in
    the APS count: with every row of the map the same vector ``n = -||h||``, the count is
    ``sum_k c_k (T - 1 - k)`` with ``c_k = #{j < k: n_k > n_j}``, O(T^2) comparisons per vector
    instead of a map of T rows (non-finite norms: the map's count, :func:`adjacency_probability_score`).
    """
    n = -torch.as_tensor(norms, dtype=torch.float64)
    T = n.shape[-1]
    if T >= 3 and bool(finite(n).all()):
        idx = torch.arange(T, device=n.device)
        count = torch.zeros(n.shape[:-1], dtype=torch.int64, device=n.device)
        step = max(1, _NORM_SCORE_ELEMS // max(1, T * n[..., 0].numel()))
        for k0 in range(0, T, step):  # c_k of keys k0 .. k0 + step - 1: every earlier j compared
            k = idx[k0:k0 + step]
            rises = ((n[..., None, k] > n[..., :, None]) & (idx[:, None] < k[None, :])).sum(-2)  # [..., k]
            count += (rises * (T - 1 - k)).sum(-1)
        return count.to(torch.float64) / (T * (T - 1) * (T - 2) / 6)  # as the map's count divides
    sim = n[..., None, :].expand(*n.shape[:-1], T, T)
    return adjacency_probability_score(sim)


def self_cosine(x: torch.Tensor) -> torch.Tensor:
    """``cos(h_i, h_j)`` of ``x [..., T, d]`` -> ``[..., T, T]`` in float64 (zero vectors give 0)."""
    x = x.to(torch.float64)
    xn = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    return xn @ xn.transpose(-1, -2)


def theory_gap(cosine_map: torch.Tensor) -> float:
    """Mean |mean cosine - sqrt(min/max)| over the strict lower triangle (uniform-attention theory)."""
    T = cosine_map.shape[-1]
    th = running_mean_cosine(T).to(cosine_map.device)
    low = torch.ones(T, T, dtype=torch.bool, device=cosine_map.device).tril(-1)
    return float((cosine_map.to(torch.float64) - th)[low].abs().mean())
