"""The facts every stage shares, each defined here once and imported everywhere else: how layers
are counted, the significance level, the offsets slash heads are sought over, and the thresholds
that turn numbers into verdicts (the readings' wording states them, so a reader can check them).

``tests/test_layout.py`` checks that none of these names is assigned anywhere else.
"""

#: how every ``layers`` list names its entries (summary.json's ``layer_info.convention``)
LAYER_CONVENTION = ("decoder layers counted from 0 (layer 0 = the first attention layer); "
                    "'embeddings' = the token embeddings before layer 0")

#: the one significance level: a sample-group test's p-value below it calls structure beyond
#: sampling noise, and a false discovery rate over several layers is held at it (Benjamini–Hochberg)
NOISE_P = 0.01
#: the smallest attainable p-value of a sign-flip test (2 / 2^G with G groups) must lie this many
#: times under NOISE_P for a test to call anything: else there are too few sequences to tell
FEW_GROUPS_MARGIN = 10

#: the offsets Δ slash heads are sought over (arXiv 2601.08297; as ``poslens slash``): the paper's
#: slash-dominant heads have small offsets, and SlashScore at large offsets is the attention sink
#: (SlashScore(S − 1) is the single entry A[S − 1, 0], the weight of the last query on key 0)
SLASH_MIN_DELTA = 1
SLASH_MAX_DELTA = 16

#: relativity index at or above which a map counts as a function of i − j alone (arXiv 2509.21042)
RELATIVE = 0.98
#: |locality| above which scores are said to rise (or fall) towards nearby keys
TREND = 0.3
#: |locality| of a panel above which it is said to favour nearby (or distant) keys
PANEL_TREND = 0.1
#: norm score at or above which norms shrink with position; at or below 1 − this, they grow
#: (arXiv 2501.00073)
NORM_SHRINK = 0.7
#: APS at or above which an adjacency pattern is "clear" (and at or above ADJACENT_WEAK "weak")
ADJACENT, ADJACENT_WEAK = 0.8, 0.6
#: a neighbourhood map's mean |cosine − theory| below which attention is called nearly uniform
THEORY_CLOSE = 0.05
#: how far APS must drop without the causal mask (and the bidirectional APS stay within it of 0.5) for the
#: mask to be what creates the adjacency pattern (``poslens neighborhood``, ``poslens sweep``)
MASK_MARGIN = 0.1

#: per claim of a verdict (``poslens fingerprint``): how far beyond both chance and the noise floor
#: the value must lie (stated in docs/fingerprint.md)
VERDICT_THRESHOLDS = {
    "sink": 0.1,        # share of heads that are sink heads (Gu et al.'s Sink_1^eps)
    "relativity": 0.5,  # share of layers whose mean score map departs from purely relative / from flat
    "slash": 0.5,       # share of slash heads that keep their pattern on random tokens
    "aps": 0.1,         # APS above 0.5 (a tenth of the way from no order to perfect order, halved)
    "frequency": 0.1,   # share of q·k energy in the low band beyond that band's share of dimensions
    "massive": 0.1,     # share of massive dims in the low band beyond that band's share of dimensions
}

#: per reading of ``poslens compare``: the smallest change (B − A, in the reading's own unit) a verdict
#: calls ``changed``, beyond the noise floor ``z·SE`` and significant after Benjamini–Hochberg (stated in
#: docs/compare.md)
CHANGE_THRESHOLDS = {
    "sink": 0.02,              # share of a head's attention on key 0
    "slash": 0.02,             # SlashScore at the head's best offset (mean weight on that diagonal)
    "prev_token": 0.02,        # SlashScore(1)
    "entropy": 0.05,           # nats per query row
    "distance": 0.01,          # mean attention distance, as a share of the sequence length
    "relativity": 0.02,        # relativity index of the layer's mean score map (key 0 left out)
    "locality": 0.02,          # locality of the layer's mean score map
    "diagonal_trend": 0.05,    # signed diagonal trend of the layer's mean score map
    "band_high": 0.02,         # share of q·k energy in the high / medium / low RoPE band
    "band_medium": 0.02,
    "band_low": 0.02,
    "massive_dims": 1.0,       # massive pre-RoPE q and k dimensions of the layer (a count)
    "loss": 0.01,              # next-token loss, nats per token
}

#: the most blocks per axis of the per-head attention maps that ``--heads all`` keeps for every head
#: (``head_maps``; also ``poslens compare``'s): block means of ``ceil(S / 128)`` positions past 128 tokens
HEAD_MAP_MAX_SIDE = 128
#: the largest count a run may ask for or hold: sequences, samples, batch rows, layers or heads
#: (2^24 = 16,777,216: a scan's plan lists its batches and a run keeps per-sequence numbers, so more
#: would not fit in memory, nor finish), and the longest sequence (2^20 tokens: one S × S float32
#: map of it is 4 TiB)
MAX_COUNT = 2**24
MAX_SEQ_LEN = 2**20
#: the most tokens a command that holds all its sequences at once (``ablate``) may ask for: 2^28
#: (268,435,456 token ids, 2 GiB, before the model's activations)
MAX_HELD_TOKENS = 2**28
