"""The papers, in a sentence or three each: the report's section introductions."""

from __future__ import annotations


from poslens.conventions import (SLASH_MAX_DELTA)

# --------------------------------------------------------------------------------------------
# the papers, in a sentence or three each (the report's section introductions)
# --------------------------------------------------------------------------------------------
PAPERS: dict[str, dict[str, str]] = {
    "kim": {
        "title": "Causal mask and RoPE: where attention scores get position",
        "short": "Causal mask and RoPE",
        "ref": "arXiv 2509.21042",
        "intro": (
            "The causal mask alone, with no parameters and inputs that carry no order, makes attention scores "
            "depend on position from the second layer on, favouring nearby keys; combined with RoPE it turns "
            "RoPE's purely relative pattern (a function of the distance i − j) into a non-relative one. Heat "
            "maps have query positions as rows and key positions as columns; the blank upper triangle is "
            "masked. Numbers: the relativity index (1 = the map depends on i − j alone; 'flat' = no "
            "positional variation beyond noise; key 0, the attention sink, left out, the value with it beside), "
            "the signed trend along the diagonals (+1 = the entry further right is higher) and the locality "
            "(+1 = every query's scores rise as the key gets closer, 0 = no trend). Decoder layers count from 0."
        ),
    },
    "slash": {
        "title": "Slash-dominant heads and RoPE",
        "short": "Slash-dominant heads",
        "ref": "arXiv 2601.08297",
        "intro": (
            "Slash-dominant heads put most of their attention on one sub-diagonal: the token Δ positions back, "
            "for every query. SlashScore(Δ) is the mean attention weight on that sub-diagonal; heads are sought "
            f"at Δ = 1 … {SLASH_MAX_DELTA} (larger offsets reach the first tokens, where attention sinks put their "
            "weight). The paper explains them by nearly rank-one pre-RoPE queries and keys combined with RoPE's "
            "medium and high frequencies; the top-1 energy of the queries' singular values measures the first "
            "condition (1 = rank one). Heads are named by decoder layer (from 0) and head index."
        ),
    },
    "neighborhood": {
        "title": "Position without positional encoding: similarity of nearby embeddings",
        "short": "Similarity of nearby embeddings",
        "ref": "arXiv 2501.00073",
        "intro": (
            "In causal transformers without positional encoding, hidden vectors of nearby tokens are more "
            "cosine-similar than distant ones, already after the first attention layer and even at random "
            "initialisation. The adjacency probability score (APS) is the fraction of position triples "
            "j < k < i where token i is more similar to the nearer token k, computed per sequence and "
            "averaged (0.5 = chance, 1 = similarity rises monotonically towards each token). Two different "
            "vectors are measured, and each sentence names which: `poslens neighborhood` the head outputs of "
            "each layer (the paper's vectors), a scan and the fingerprint the residual stream after it. A scan's "
            "'mean-map APS' is the same count on the cosine map averaged over sequences: it tends to 1 for "
            "any consistent trend as sequences are added and has no chance level. Layers: the embeddings by "
            "name, then decoder layers from 0."
        ),
    },
}
