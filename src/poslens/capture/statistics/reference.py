"""The capture written to be read: every built-in statistic of a scan, from eager attention, one
layer, sequence and head at a time, in float64.

This is what :class:`poslens.capture.engine.attention.Capture` computes, said plainly. The fast capture
folds batch and head sums into matrix products, takes the softmax in cache-sized chunks and never
materialises a layer's ``[B, H, S, S]`` weights; this module does the obvious thing instead, so that
a reader can check a definition here and the tests can check the fast path against it
(``tests/capture/test_reference_capture.py``). It is slow and memory-hungry by design: use it on
tiny models and short sequences.

It runs a Llama-style model (decoder layers at ``model.model.layers``, ``self_attn`` with
``q_proj``/``k_proj``, rotary embeddings in the rotate-half layout with cos/sin handed to each
attention module) through an attention function of its own that records the layer's queries and
keys after RoPE, its logit scale, sliding window and soft-cap, and computes the layer's output
eagerly: ``softmax(mask(scaling * q k^T)) v``. Queries and keys before RoPE are the recorded ones
rotated back with the textbook inverse ``x cos - rotate_half(x) sin``.
"""

from __future__ import annotations

import math

import torch

#: the attention implementation name this module registers with transformers
REFERENCE_ATTN = "poslens_reference"


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _eager_attention(record: dict):
    """An ``AttentionInterface`` function: plain eager attention that appends what it saw to ``record``."""

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None,
                  softcap=None, **kwargs):
        B, H, S, D = query.shape
        scaling = 1.0 / math.sqrt(D) if scaling is None else float(scaling)
        if sliding_window is None:
            sliding_window = getattr(module, "sliding_window", None)
        g = H // key.shape[1]
        k = key.repeat_interleave(g, dim=1)
        v = value.repeat_interleave(g, dim=1)
        logits = (query @ k.transpose(-1, -2)) * scaling
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        i = torch.arange(S, device=query.device)[:, None]
        j = torch.arange(S, device=query.device)[None, :]
        visible = j <= i
        if sliding_window:
            visible = visible & (i - j < sliding_window)
        weights = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
        out = (weights @ v).transpose(1, 2)  # [B, S, H, D]: the head outputs before the output projection
        record.setdefault("layers", {})[module.layer_idx] = {
            "q": query.detach().double(), "k": key.detach().double(), "scaling": scaling, "visible": visible,
            "softcap": softcap, "head_out": out.detach().double(), "cos_sin": record.pop("cos_sin", None)}
        return out.contiguous(), None

    return attention


def record_forward(model_dir, ids: torch.Tensor) -> dict:
    """Load the model from ``model_dir`` (float32, the recording attention) and run ``ids [B, S]``.

    Returns ``{"layers": {l: {q, k, scaling, visible, softcap, head_out, cos_sin}}, "resid":
    [x_0, x_1, ...]}``: post-RoPE queries/keys ``[B, H(k), S, D]``, the head outputs ``[B, S, H, D]``,
    the rotary ``(cos, sin)`` the layer received, and the residual stream (``x_0`` the input of layer
    0, ``x_{l+1}`` the output of layer l), all float64."""
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    record: dict = {}
    AttentionInterface.register(REFERENCE_ATTN, _eager_attention(record))
    AttentionMaskInterface.register(REFERENCE_ATTN, sdpa_mask)  # unused: the function masks for itself
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                 attn_implementation=REFERENCE_ATTN).eval()
    layers = model.model.layers
    resid: list = [None] * (len(layers) + 1)
    hooks = []
    for l, layer in enumerate(layers):
        def before(_m, args, kwargs, l=l):
            x = args[0] if args else kwargs["hidden_states"]
            if l == 0:
                resid[0] = x.detach().double()
            if kwargs.get("position_embeddings") is not None:
                record["cos_sin"] = tuple(t.detach().double() for t in kwargs["position_embeddings"])

        def after(_m, _args, out, l=l):
            resid[l + 1] = (out[0] if isinstance(out, tuple) else out).detach().double()
        hooks += [layer.register_forward_pre_hook(before, with_kwargs=True), layer.register_forward_hook(after)]
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    record["resid"] = resid
    return record


# --------------------------------------------------------------------------------------------
# the statistics, one at a time
# --------------------------------------------------------------------------------------------
def aps(m: torch.Tensor) -> float:
    """The paper's APS of one map (arXiv 2501.00073): the fraction of triples ``j < k < i`` with
    ``m[i, k] > m[i, j]`` (strict rises; the main diagonal left out)."""
    rows = m.tolist()
    hits = total = 0
    for i in range(len(rows)):
        for j in range(i):
            for k in range(j + 1, i):
                total += 1
                hits += rows[i][k] > rows[i][j]
    return hits / total if total else float("nan")


def cosine_map(x: torch.Tensor) -> torch.Tensor:
    """``[S, S]`` cosines of the rows of ``x [S, d]`` (0 where a row is zero)."""
    n = x.norm(dim=-1)
    safe = torch.where(n > 0, n, torch.ones_like(n))
    # every entry by the same elementwise sum, so identical rows (a repeated token) tie exactly; a
    # blocked matrix product may round them apart, differently on different CPUs
    c = (x[:, None, :] * x[None, :, :]).sum(-1) / (safe[:, None] * safe[None, :])
    return torch.where((n[:, None] > 0) & (n[None, :] > 0), c, torch.zeros_like(c))


def reference_capture(model_dir, ids: torch.Tensor, *, heads=(), aps_max_positions: int = 256,
                      noise_groups: int = 16, noise_max_positions: int = 128) -> dict[str, torch.Tensor]:
    """Every built-in statistic of a scan of ``ids [B, S]`` (all layers), float64, by definition
    (the names and shapes of ``maps.safetensors``; ``score_groups`` as the mean map of each
    non-empty sequence group, ``score_group_counts`` their sizes)."""
    rec = record_forward(model_dir, ids)
    B, S = ids.shape
    L = len(rec["layers"])
    first = rec["layers"][0]
    dev = first["q"].device
    f64 = dict(dtype=torch.float64, device=dev)
    H, Hk, D = first["q"].shape[1], first["k"].shape[1], first["q"].shape[-1]
    out = {name: torch.zeros(shape, **f64) for name, shape in {
        "scores": (L, S, S), "probs": (L, S, S), "slash": (L, H, S), "sink_heads": (L, H, S),
        "cosine": (L + 1, S, S), "norms": (L + 1, S), "attn_cosine": (L, S, S), "attn_norms": (L, S),
        "q_gram": (L, H, D, D), "k_gram": (L, Hk, D, D), "dim_logit": (L, H, D), "aps_seq": (L + 1,),
        "attn_aps_seq": (L,), "head_scores": (len(heads), S, S), "head_probs": (len(heads), S, S)}.items()}
    grid = torch.arange(0, S, -(-S // noise_max_positions), device=dev)
    G = min(noise_groups, B)
    groups = torch.zeros(G, L, grid.numel(), grid.numel(), **f64)
    counts = torch.zeros(G, dtype=torch.int64, device=dev)
    pos = (torch.arange(S, device=dev) if S <= aps_max_positions
           else torch.linspace(0, S - 1, aps_max_positions, device=dev).round().long())

    for l in range(L):
        r = rec["layers"][l]
        g = H // Hk
        visible = r["visible"]
        n_pairs = int(visible.sum())
        for b in range(B):
            for h in range(H):
                q, k = r["q"][b, h], r["k"][b, h // g]  # [S, D] post-RoPE
                logits = (q @ k.T) * r["scaling"]
                if r["softcap"]:
                    logits = torch.tanh(logits / r["softcap"]) * r["softcap"]
                scores = torch.where(visible, logits, torch.zeros_like(logits))  # unseen entries stored as 0
                A = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
                out["scores"][l] += scores / (H * B)
                out["probs"][l] += A / (H * B)
                for d in range(S):  # SlashScore(d): the mean of the d-th sub-diagonal
                    out["slash"][l, h, d] += A.diagonal(-d).mean() / B
                out["sink_heads"][l, h] += A[:, 0] / B
                # per-dimension logit contribution over the visible pairs (post-RoPE)
                pair = visible.to(torch.float64)
                out["dim_logit"][l, h] += r["scaling"] * torch.einsum("id,jd,ij->d", q, k, pair) / n_pairs / B
                for m, (hl, hh) in enumerate(heads):
                    if (hl, hh) == (l, h):
                        out["head_scores"][m] += scores / B
                        out["head_probs"][m] += A / B
            # the noise groups: sequence b's head-mean scores on the grid, into group b % G
            groups[b % G, l] += grid_scores(r, b, grid)
            # second moments of the pre-RoPE queries and keys: rotate back with the layer's cos/sin
            q_pre, k_pre = r["q"][b], r["k"][b]
            if r["cos_sin"] is not None:
                cos, sin = (t[b if t.shape[0] > 1 else 0] for t in r["cos_sin"])  # [S, rotary dim]
                rd = cos.shape[-1]
                q_pre = torch.cat([q_pre[..., :rd] * cos - _rotate_half(q_pre[..., :rd]) * sin, q_pre[..., rd:]], -1)
                k_pre = torch.cat([k_pre[..., :rd] * cos - _rotate_half(k_pre[..., :rd]) * sin, k_pre[..., rd:]], -1)
            for h in range(H):
                out["q_gram"][l, h] += q_pre[h].T @ q_pre[h] / S / B
            for h in range(Hk):
                out["k_gram"][l, h] += k_pre[h].T @ k_pre[h] / S / B
            # the head outputs, concatenated, as the residual stream's cosine maps
            x = r["head_out"][b].reshape(S, H * D)
            out["attn_cosine"][l] += cosine_map(x) / B
            out["attn_norms"][l] += x.norm(dim=-1) / B
            out["attn_aps_seq"][l] += aps(cosine_map(x[pos])) / B
    for b in range(B):
        counts[b % G] += 1
    for idx, x in enumerate(rec["resid"]):
        for b in range(B):
            out["cosine"][idx] += cosine_map(x[b]) / B
            out["norms"][idx] += x[b].norm(dim=-1) / B
            out["aps_seq"][idx] += aps(cosine_map(x[b][pos])) / B
    out["score_groups"] = groups / counts.to(torch.float64)[:, None, None, None]
    out["score_group_counts"] = counts
    if not heads:
        del out["head_scores"], out["head_probs"]
    return out


def grid_scores(r: dict, b: int, grid: torch.Tensor) -> torch.Tensor:
    """Sequence ``b``'s head-mean scores on the noise-grid positions, 0 above the diagonal (entries
    outside a sliding window are kept here: the summary masks them when it reads the groups)."""
    q, k = r["q"][b], r["k"][b]
    H = q.shape[0]
    g = H // k.shape[0]
    causal = grid[None, :] <= grid[:, None]
    total = torch.zeros(grid.numel(), grid.numel(), dtype=torch.float64, device=q.device)
    for h in range(H):
        logits = (q[h][grid] @ k[h // g][grid].T) * r["scaling"]
        if r["softcap"]:
            logits = torch.tanh(logits / r["softcap"]) * r["softcap"]
        total += torch.where(causal, logits, torch.zeros_like(logits)) / H
    return total
