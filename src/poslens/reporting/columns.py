"""What every table column of the report means: one short definition per column, shown under the
table. A table may carry its own (``definitions``: column -> text, in ``summary["tables"]``); the
columns commands write are defined here, once, by name or by pattern."""

from __future__ import annotations

import re

from poslens.metrics.verdicts import SINK_CHANCE_FORMULA, uniform_sink_weight

#: column name -> definition (the columns commands write into ``summary["tables"]`` and the report's own)
COLUMNS: dict[str, str] = {
    # heads, layers, offsets
    "layer": "decoder layer, counted from 0 ('embeddings': the token embeddings before layer 0)",
    "layer.head": "the head: its decoder layer (from 0), a dot, its index in the layer",
    "head": "the head: its decoder layer (from 0), a dot, its index in the layer",
    "Δ": "offset i − j between query position i and key position j (the diagonal a slash lies on)",
    "delta": "offset i − j between query position i and key position j (the diagonal a slash lies on)",
    "best Δ": "the offset Δ ≥ 1 at which the head's SlashScore is largest",
    "kappa": "threshold κ on SlashScore: a head is (κ, Δ)-slash-dominant when SlashScore(Δ) ≥ κ",
    # slash heads (arXiv 2601.08297)
    "SlashScore": "mean attention weight the head puts on key i − Δ, over queries i ≥ Δ and sequences "
                  "(arXiv 2601.08297), at the best Δ",
    "SDHs": "number of (κ, Δ)-slash-dominant heads",
    "fraction of heads": "those heads as a share of all heads of the model",
    "heads (layer.head, best first)": "the slash-dominant heads, highest SlashScore first",
    "q σ1²/Σσ²": "share of the pre-RoPE queries' energy in their top singular direction (1 = rank one)",
    "k σ1²/Σσ²": "share of the pre-RoPE keys' energy in their top singular direction (1 = rank one)",
    "q eff. rank": "effective rank of the pre-RoPE queries, exp(entropy of σ²/Σσ²) (1 = rank one)",
    "k eff. rank": "effective rank of the pre-RoPE keys, exp(entropy of σ²/Σσ²) (1 = rank one)",
    "q n95": "number of singular directions holding 95 % of the pre-RoPE queries' energy",
    "k n95": "number of singular directions holding 95 % of the pre-RoPE keys' energy",
    "predicted Δ": "offset at which the rank-one RoPE reading of the head's q and k predicts the slash",
    "predicted peak Δ": "offset at which the rank-one RoPE reading of the head's q and k predicts the slash",
    "RoPE Δ": "offset at which the rank-one RoPE reading of the head's q and k predicts the slash",
    "profile corr": "correlation over Δ between the observed SlashScore profile and the RoPE prediction",
    "coherence": "how constant the q·k coefficients are across tokens, E[ab] / √(E a² E b²) (1 = constant)",
    "band use high/med/low": "shares of the head's RoPE amplitude in the high-, medium- and low-frequency "
                             "bands (they sum to 1)",
    "in-distribution": "SlashScore at Δ on the scan's own data (text or task prompts)",
    "random tokens": "SlashScore at Δ on i.i.d. random tokens",
    "text": "SlashScore at Δ on text",
    "random": "SlashScore at Δ on i.i.d. random tokens",
    "ratio": "SlashScore on random tokens divided by SlashScore in distribution",
    "persists": "yes when the head stays slash-dominant (SlashScore ≥ κ) on random tokens",
    # Kim: panels and layers (arXiv 2509.21042)
    "panel": "the paper's panel label",
    "matrix": "the matrix the panel shows",
    "relativity index": "1 − Var(diagonal-normalised map) / Var(map), key 0 left out (1 = the map depends on "
                        "i − j alone)",
    "non-relativity": "1 − relativity index: the share of the map's variance that is not a function of i − j",
    "non-relativity with key 0": "the same with key 0 (the sink column) included",
    "locality": "+1: every query's scores rise as the key gets closer; −1: they fall (key 0 left out)",
    "diagonal trend": "signed trend along the diagonals of the diagonal-normalised map (+1: entries further "
                      "right are higher)",
    "mean off-diagonal": "mean of the map's entries below the diagonal",
    # Zuo: neighbourhood (arXiv 2501.00073)
    "APS causal (mean ± std)": "adjacency probability score of the head outputs (arXiv 2501.00073): how often, "
                               "along a row of the cosine map, the nearer position is the more alike (0.5 = no order, "
                               "1 = always), causal mask; mean ± std over sequences",
    "norm score causal": "the APS count applied to −‖h_i‖ (1 = norms shrink with position; 0.5 = chance), causal",
    "resid APS causal": "APS of the residual stream after the layer, causal mask",
    "APS bidirectional": "APS of the head outputs with the causal mask removed (the control; 0.5 = chance)",
    "norm score bidirectional": "norm score with the causal mask removed (the control)",
    "shape (layers x width)": "the simulated model's number of layers and width",
    "σ": "standard deviation of the random weights",
    "APS layer 0 causal": "APS of layer 0's head outputs, causal mask (0.5 = chance)",
    "APS mean over layers, causal": "APS of the head outputs averaged over layers, causal mask",
    "APS last layer, causal": "APS of the last layer's head outputs, causal mask",
    "norm score layer 0, causal": "norm score of layer 0's head outputs, causal mask (0.5 = chance)",
    "APS layer 0 bidirectional": "APS of layer 0's head outputs with the causal mask removed",
    "APS mean over layers, bidirectional": "APS of the head outputs averaged over layers with the causal mask removed",
    # probes
    "model": "the model (its directory or file name)",
    "PE": "the model's position encoding (none = NoPE, rope = RoPE)",
    "state": "trained weights, or the same architecture at its random initialisation",
    "best cosine r (layer)": "the best correlation of a probe reading position from cosine similarities, and "
                             "its layer",
    "best norm r (layer)": "the best correlation of a probe reading position from hidden-state norms, and its "
                           "layer",
    "layers where cosine MSE < norm MSE": "layers where the cosine probe's error is below the norm probe's",
    "cosine beats norm?": "yes when the cosine probe beats the norm probe in most layers",
    # training
    "step": "training step",
    "train loss": "training loss at that step (nats per token)",
    "task accuracy": "accuracy on the training task at that step",
    "task": "the training task",
    "data": "the training data",
    "steps": "training steps",
    "parameters": "number of parameters",
    "initial loss": "loss before training (nats per token)",
    "final loss": "loss at the end of training (nats per token)",
    "accuracy": "accuracy on the evaluation set",
    "accuracy (longer)": "accuracy on evaluation sequences longer than those trained on",
    "quantity": "what was measured",
    "value": "its value",
    # ablate
    "condition": "the condition's name",
    "intervention": "what is switched off or changed in the attention pass",
    "layers": "the decoder layers (from 0) the intervention applies to",
    "delta_loss": "paired change of the mean next-token loss against the unmodified model (nats per token)",
    "se": "standard error of that change, from sequence groups",
    "p": "p-value of 'no change'",
    "beyond_noise": "yes when the change is significant at a false discovery rate of 0.01 over the layers "
                    "(Benjamini–Hochberg)",
    # compare (the changed cells of two variants)
    "reading": "the positional reading compared (sink, slash, prev_token, entropy, distance per head; the others "
               "per layer; loss)",
    "length": "sequence length in tokens the reading was measured at",
    "layer, head": "decoder layer (from 0) and head index; a layer alone: the per-layer reading or the mean over "
                   "its heads",
    "A": "the reading on side A (the reference), mean over sequence groups",
    "B": "the reading on side B (the other model or variant), on the same sequences",
    "B − A": "paired change of the reading, mean over sequence groups",
    "floor": "the noise floor z·SE: the largest change sampling noise alone reaches at the level",
    # reproduction, comparisons, fingerprint
    "experiment": "the reproduction experiment",
    "paper": "the paper it reproduces (arXiv identifier)",
    "verdict": "reproduced, not reproduced, or not decided (by the experiment's stated rule)",
    "run": "the run directory the row comes from",
    "trait": "the trait, one per row; layers (RoPE): decoder layers, and of them those that rotate queries and "
             "keys; sink heads, text and sink heads, random: share of heads whose mean attention weight on key 0 "
             "exceeds ε, on text and on random tokens (0 … 100 %; chance: 0 %, as a head attending evenly puts "
             f"{SINK_CHANCE_FORMULA} on key 0, {100 * uniform_sink_weight(128):.1f}% at S = 128, below ε); "
             "slash heads (persist): heads whose SlashScore ≥ κ at some Δ in the "
             "slash range, and of them those still ≥ κ on random tokens; relativity (median): median over the "
             "non-flat layers of the relativity index, 0 … 1 (1 = the mean score map depends on i − j alone); "
             "non-flat layers: layers whose mean score map varies beyond its noise floor, of all layers; signed "
             "trend (mean): mean over the non-flat layers of the signed diagonal trend, −1 … +1 (0 = none); APS "
             "min–max: the lowest and highest per-sequence APS of the residual stream over layers, 0 … 1 (0.5 = chance, 1 = every row "
             "rises towards the diagonal); RoPE energy hi/med/lo: percentages of q·k energy in the high-, medium- "
             "and low-frequency RoPE pairs, mean over the rotating layers (the rest: unrotated dimensions; chance: "
             "each band's share of the dimensions); massive Q dims (low) and massive K dims (low): query and key "
             "dimensions whose RMS over tokens exceeds λ × the layer's mean, and the share of them in the low band "
             "(chance: that band's share of the dimensions)",
    "dim": "the dimension's index in the head's pre-RoPE query or key",
    "pair": "the rotary pair the dimension belongs to (—: a dimension RoPE leaves unrotated)",
    "band": "the RoPE frequency band of that pair (high, medium or low, by its wavelength against the scanned "
            "length)",
    "RMS / mean": "the dimension's RMS over tokens divided by the layer's mean RMS (massive: above λ = 5)",
    "Q/K": "whether the dimension is one of the head's pre-RoPE queries (Q) or keys (K)",
}

#: a fingerprint's layer types (its per-type tables' columns): a layer's RoPE table's kind, ``rope`` for a model
#: with one kind, ``no_rope`` for layers without RoPE
LAYER_TYPES: dict[str, str] = {
    "rope": "the traits over the model's layers that rotate queries and keys (its one kind of RoPE layer)",
    "no_rope": "the traits over the model's layers without RoPE (no positional encoding)",
    "sliding_attention": "the traits over the model's sliding-window layers (each query sees only the latest keys "
                         "of its window)",
    "full_attention": "the traits over the model's global layers (full causal attention)",
}


def layer_type(name: str) -> str:
    """The definition of a fingerprint's layer-type column (a kind not in :data:`LAYER_TYPES`: by its name)."""
    return LAYER_TYPES.get(str(name)) or f"the traits over the model's layers of the kind '{name}' (its RoPE table's name)"

#: (pattern, definition with the pattern's groups as {1}, {2}, ...) for columns named after a parameter
PATTERNS: list[tuple[re.Pattern, str]] = [
    (re.compile(r"^κ=(.+)$"), "number of heads with SlashScore(Δ) ≥ {1} at this Δ ((κ, Δ)-slash-dominant heads)"),
    (re.compile(r"^heads at κ=(.+)$"), "those heads at κ = {1} (layer.head), best first"),
    (re.compile(r"^SlashScore\((\d+)\) in-dist\.$"), "SlashScore at Δ = {1} of that head on the task's prompts"),
    (re.compile(r"^SlashScore\((\d+)\) random$"), "SlashScore at Δ = {1} of that head on i.i.d. random tokens"),
    (re.compile(r"^(vector|cosine|norm) (linear|mlp) r / MSE$"),
     "a {2} probe reading position from the hidden states' {1} features: Pearson r / mean squared error on "
     "held-out sequences"),
]


def definition(column: str) -> str | None:
    """The definition of a column name, or None for a name defined nowhere."""
    c = str(column)
    if c in COLUMNS:
        return COLUMNS[c]
    for pat, text in PATTERNS:
        m = pat.match(c)
        if m:
            return text.format(None, *m.groups())
    return None


def definitions(columns: list[str], given: dict | None = None) -> list[tuple[str, str]]:
    """``(column, definition)`` for each column of a table, in order, the table's own (``given``)
    first; a column defined nowhere is left out (the report's tests require one for every column)."""
    given = given if isinstance(given, dict) else {}
    out = []
    for c in columns:
        text = given.get(c) if isinstance(given.get(c), str) else definition(c)
        if text and str(c).strip():
            out.append((str(c), text))
    return out


# --------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------
#: the columns of :meth:`Result.heads` (a scan), each defined
HEAD_COLUMNS = {
    "layer": "decoder layer, counted from 0",
    "head": "query head, counted from 0",
    "sink": "the head's mean attention weight on key 0 over queries 1 … S−1 and over sequences (Gu et al., ICLR 2025)",
    "slash_offset": "its strongest offset Δ in 1 … 16 (query − key), at most S − ⌈S/2⌉ (half the queries see a key "
                    "that far back)",
    "slash_score": "SlashScore(Δ) there: mean attention weight on the Δ-th sub-diagonal (arXiv 2601.08297)",
}
#: the columns :meth:`Result.layers` can have (a scan's; other commands add their own), each defined
LAYER_COLUMNS = {
    "layer": "decoder layer, counted from 0 ('embeddings': the input of layer 0)",
    "rope": "whether the layer rotates its queries and keys",
    "sliding_window": "the layer's attention window in tokens (None: full causal attention)",
    "relativity_index": "1 − Var(diagonal-normalised mean score map) / Var(map), key 0 left out (1 = a function of "
                        "i − j alone; arXiv 2509.21042); noise-corrected where the noise groups cover the whole map "
                        "(relativity_index_noise_corrected), which can lift it above relativity_index_uncorrected: "
                        "sampling noise inflates the within-diagonal variance; None where the map is flat",
    "relativity_index_uncorrected": "the same index before the noise correction (variances with the noise in them)",
    "relativity_index_noise_corrected": "True where relativity_index is noise-corrected",
    "relativity_index_with_sink": "the relativity index with key 0 included",
    "locality": "+1: every query's scores rise as the key gets closer; −1: they fall (key 0 left out)",
    "locality_with_sink": "locality with key 0 included",
    "diagonal_trend": "signed trend along each diagonal of the diagonal-normalised map (+1: the entry further right "
                      "is higher)",
    "diagonal_trend_se": "standard error of diagonal_trend over sequence groups",
    "within_diag_rms": "RMS of the diagonal-normalised map (the non-relative part)",
    "within_diag_rms_noise": "the RMS sampling noise alone gives it (the noise floor)",
    "flat": "True where the map does not vary with position beyond its noise floor (flat_p ≥ 0.01)",
    "flat_p": "p-value of 'the map is flat' (sign-flip test over sequence groups)",
    "nonrelative_p": "p-value of 'the map is purely relative'",
    "trend_p": "p-value of 'no diagonal trend'",
    "noise_groups": "number of sequence groups the p-values and standard errors come from",
    "noise_positions": "positions of the grid the noise groups were kept on",
    "grid_relativity_index": "relativity index of the map on that grid (the statistic the p-values test)",
    "grid_diagonal_trend": "diagonal trend on that grid",
    "grid_within_diag_rms": "within-diagonal RMS on that grid",
    "grid_locality": "locality on that grid",
    "sink_weight": "mean attention weight on key 0 over heads, queries 1 … S−1 and sequences",
    "aps": "adjacency probability score of the residual stream after the layer (arXiv 2501.00073): per sequence, "
           "mean over sequences (0.5 = no order, 1 = every row rises towards the diagonal); = aps_mean",
    "aps_mean": "per-sequence APS, mean over sequences",
    "aps_std": "per-sequence APS, standard deviation over sequences",
    "attn_aps": "APS of the attention outputs (concatenated heads before the output projection) = attn_aps_mean",
    "attn_aps_mean": "per-sequence APS of the attention outputs, mean over sequences",
    "attn_aps_std": "its standard deviation over sequences",
    "mean_map_aps": "APS of the cosine map averaged over sequences (not the paper's per-sequence APS: it tends to 1 "
                    "for any consistent trend as sequences are added)",
    "attn_mean_map_aps": "the same for the attention outputs",
    "norm_score": "the APS count applied to −‖h_i‖: 1 = norms shrink with position (arXiv 2501.00073)",
}
