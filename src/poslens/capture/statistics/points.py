"""The capture points: every tensor of a decoder layer ``l`` that poslens reads, each under one name.

``B`` sequences of ``S`` tokens, ``H`` query heads, ``Hk`` key/value heads (grouped-query attention),
head dimension ``D``, model width ``d``. With ``scores`` or ``probs`` a piece is a chunk: ``b`` of the
batch's ``B`` sequences (``seqs``), ``c`` query rows (``rows``) and the keys ``0 .. k - 1`` those rows
may see (``k = S`` without the causal mask; query ``i`` sees keys ``j <= i``, and only those inside a
sliding window); the other attention points come cut to the same sequences, rows and keys. Without
them a piece is the layer.

Who may ask for a point: ``hook`` :func:`poslens.capture.model.adapters.hook_point` (any analysis),
``user`` a :class:`poslens.Statistic`'s ``needs`` (:data:`CAPTURE_POINTS`, docs/statistics.md),
``builtin`` a built-in statistic's ``needs`` (:data:`INTERMEDIATES`). Where one tensor has two
layouts, its two names say so (``head_out`` / ``attn_z``, ``q_post``/``k_post`` / ``qk``):

========================  ===================  ====================================================  ===================
name                      layout               what it is                                            read by
========================  ===================  ====================================================  ===================
``resid_pre``             ``[B, S, d]``        the residual stream entering layer l (l = 0: the      hook, user, builtin
                                               embeddings; a built-in reads layer 0's only)
``attn_in``               ``[B, S, d]``        what the attention module reads (after the            hook
                                               pre-attention norm)
``attn_z``                ``[B, S, H·D]``      ``head_out`` with the heads side by side: the input   hook
                                               of the output projection (o_proj / dense / c_proj)
``attn_out``              ``[B, S, d]``        the output projection's output                        hook
``resid_mid``             ``[B, S, d]``        the residual stream after attention, before the MLP   hook
                                               (sequential blocks only)
``mlp_in``, ``mlp_out``   ``[B, S, d]``        what the MLP (or MoE block) reads (after its norm,    hook
                                               where the block has one), and its output
``resid_post``            ``[B, S, d]``        the residual stream leaving layer l                   hook, user, builtin
``q_pre``, ``k_pre``      ``[B, H|Hk, S, D]``  queries / keys before RoPE, in the model's dtype      hook, user
                                               (after q_norm / k_norm, fused projections split;
                                               un-rotated with the cos/sin the layer received;
                                               ``q_post``/``k_post`` in a layer without RoPE)
``q_post``, ``k_post``    ``[B, H|Hk, S, D]``  queries / keys as the attention function receives     hook, user
                                               them
``qk``                    two tensors          ``q_post``, ``k_post`` in float32, contiguous         builtin
                                               (``LayerBatch.q/k``; ``LayerBatch.pre_rope()``
                                               un-rotates them once, ``half_layout()`` reorders
                                               their pairs)
``head_out``              ``[B, S, H, D]``     each head's attention output, before the output       user, builtin
                                               projection (a chunk: ``[b, c, H, D]``)
``scores``                ``[b, H, c, k]``     float32 ``scaling · q_i·k_j`` after RoPE              user, builtin
                                               (soft-capped where the model caps), ``-inf`` where
                                               the query does not see the key
``probs``                 ``[b, H, c, k]``     float32 attention weights, ``softmax(scores)`` (each  user, builtin
                                               full row sums to 1)
``rows``, ``seqs``        ``slice``            where a chunk lies: its query rows, its sequences     user
``logit_sum``             ``[c, k]``           visible scores summed over the batch and the heads    builtin
``weight_sum``            ``[c, k]``           probs summed over the batch and the heads             builtin
``head_weight_sums``      ``[H, c, k]``        each head's probs summed over the batch               builtin
``diagonal_sums``         ``[H, k]``           each head's probs ``A[i, i - d]`` of the rows,        builtin
                                               summed over the batch, by offset d
``key0_weights``          ``[H, c]``           each head's probs on key 0, summed over the batch     builtin
``selected_logit_sums``   ``[n, c, k]``        the ``--heads`` heads' visible scores summed over     builtin
                                               the batch
``selected_weight_sums``  ``[n, c, k]``        the ``--heads`` heads' probs summed over the batch    builtin
========================  ===================  ====================================================  ===================

In sums, masked entries (above the diagonal, outside a sliding window) are 0.
"""

from __future__ import annotations

#: the points on a decoder layer's modules (forward hooks, :func:`poslens.capture.model.adapters.hook_point`)
MODULE_POINTS = ("resid_pre", "attn_in", "attn_z", "attn_out", "resid_mid", "mlp_in", "mlp_out", "resid_post")
#: the points inside the attention function (the model must run the poslens attention)
QK_POINTS = ("q_pre", "k_pre", "q_post", "k_post")
#: the residual stream around a layer
RESIDUAL_POINTS = ("resid_pre", "resid_post")
#: the attention pass's per-sequence chunks
PASS_POINTS = ("scores", "probs")
#: where a chunk lies
WHERE_POINTS = ("rows", "seqs")

#: The capture points a :class:`poslens.Statistic` can ask for, with the shape each piece has (the
#: table above).
CAPTURE_POINTS: dict[str, str] = {
    "scores": "[b, H, c, k] float32: scaling * q_i . k_j (post-RoPE, soft-capped where the model caps), "
              "-inf where the query does not see the key",
    "probs": "[b, H, c, k] float32: the post-softmax attention weights (each full row sums to 1)",
    "q_pre": "[B, H, S, D]: queries before RoPE (the model's dtype; equal to q_post in a layer without RoPE)",
    "k_pre": "[B, Hk, S, D]: keys before RoPE (Hk key/value heads under grouped-query attention)",
    "q_post": "[B, H, S, D]: queries as attention sees them (after RoPE)",
    "k_post": "[B, Hk, S, D]: keys as attention sees them (after RoPE)",
    "head_out": "[B, S, H, D]: each head's attention output, before the output projection",
    "resid_pre": "[B, S, d]: the residual stream entering the layer",
    "resid_post": "[B, S, d]: the residual stream leaving the layer",
    "rows": "slice: the query rows of a chunk (with scores or probs)",
    "seqs": "slice: the batch's sequences of a chunk (with scores or probs)",
}

#: the users' points read inside the attention call (the rest are the residual stream around the
#: layer and where a chunk lies)
ATTENTION_POINTS = PASS_POINTS + QK_POINTS + ("head_out",)

#: The intermediates a built-in statistic can ask for (the table above): the attention pass hands the
#: chunked ones a chunk of query rows at a time, the others once per layer.
INTERMEDIATES: dict[str, str] = {
    "logit_sum": "[c, k] visible scores summed over the batch and the heads",
    "weight_sum": "[c, k] probs summed over the batch and the heads",
    "head_weight_sums": "[H, c, k] each head's probs summed over the batch",
    "diagonal_sums": "[H, k] each head's probs A[i, i - d] of the rows, summed over the batch, by offset d",
    "key0_weights": "[H, c] each head's probs on key 0, summed over the batch",
    "selected_logit_sums": "[n, c, k] the --heads heads' visible scores summed over the batch",
    "selected_weight_sums": "[n, c, k] the --heads heads' probs summed over the batch",
    "scores": CAPTURE_POINTS["scores"],
    "probs": CAPTURE_POINTS["probs"],
    "qk": "q_post and k_post in float32, contiguous (LayerBatch.q/k, pre_rope(), half_layout())",
    "head_out": CAPTURE_POINTS["head_out"],
    "resid_pre": "[B, S, d] the embeddings (add_hidden, index 0)",
    "resid_post": "[B, S, d] the residual stream leaving each captured layer (add_hidden, index m + 1)",
}
#: intermediates handed chunk by chunk (every other one: once per layer)
CHUNKED = frozenset(INTERMEDIATES) - {"qk", "head_out"} - set(RESIDUAL_POINTS)
#: chunk intermediates summed over the whole batch (the rest are per sequence)
BATCH_SUMS = CHUNKED - set(PASS_POINTS)
