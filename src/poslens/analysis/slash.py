"""Slash-dominant heads and their RoPE explanation (arXiv 2601.08297), on a scan's tensors.

Pure functions: a scan's ``maps.safetensors`` tensors in, numbers out. Inputs:

- ``slash [L, H, S]``: SlashScore(Δ) per head (mean post-softmax weight on the Δ-th sub-diagonal);
- ``q_gram [L, H, D, D]`` / ``k_gram [L, Hk, D, D]``: per-token second moments of pre-RoPE queries
  and keys (eigenvalues = squared singular values of the tokens x head_dim matrix / tokens);
- ``dim_logit [L, H, D]``: per-dimension mean post-RoPE logit contribution over causal pairs.

**SDH table.** A head is (κ, Δ)-slash-dominant if SlashScore(Δ) >= κ; the table counts such heads
over a κ grid and a Δ range. **Persistence**: an SDH found on in-distribution prompts persists if
the same head is still (κ, Δ)-dominant on prompts of i.i.d. uniformly random tokens.

**RoPE decomposition** (rank-one reading). With q_i ≈ a u and k_j ≈ b v (u, v the top eigenvectors
of the pre-RoPE second moments) and pair l = dims (l, l + r/2) read as the complex number
``u_l = u[l] + i u[l + r/2]``, Hugging Face's rotate_half rotation multiplies u_l by
``exp(i θ_l p)`` at position p, so

    logit(i - j) = Σ_l A_l cos(θ_l (i - j) + φ_l),   A_l = c |u_l| |v_l|,   φ_l = arg u_l - arg v_l

with ``c = scaling · sqrt(λ_q λ_k)`` (λ the top eigenvalues: the rms coefficients a, b) and the
sign of the product a·b taken from ``dim_logit`` (a negative sign adds π to every φ_l). The
predicted slash profile is the causal softmax of that logit, row by row, averaged over rows
exactly as SlashScore is; the predicted peak offset is its arg-max. Pairs are put into RoPE bands
(:func:`poslens.rope.frequency_bands`); a band's *usage* is its share of Σ A_l and its
*contribution to the peak* is ``Σ_{l in band} A_l cos(θ_l Δ* + φ_l)`` minus that sum's mean over
all offsets (how much the band lifts the peak above the average offset). *(inferred: the paper
gives no thresholds or shares.)*
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from poslens.errors import PoslensError
from poslens.metrics.rank import rank_measures
from poslens.report.readings import slash_command_readings
from poslens.rundir import LAYER_CONVENTION
from poslens.rope import BANDS, frequency_bands, inv_freq


def _t(x) -> torch.Tensor:
    # dtype at creation: a Python list of floats (summary.json's inv_freq) must not pass through float32
    return torch.as_tensor(x, dtype=torch.float64)


def _check_slash(slash) -> torch.Tensor:
    s = _t(slash)
    if s.ndim != 3:
        raise PoslensError(f"slash tensor has shape {tuple(s.shape)}; expected [layers, heads, seq_len] "
                           "(maps.safetensors of `poslens scan`).")
    return s


# --------------------------------------------------------------------------------------------
# profiles, SDH table, persistence
# --------------------------------------------------------------------------------------------
def sdh_table(slash, kappas: list[float], max_delta: int, min_delta: int = 0,
              layer_ids: list[int] | None = None, max_listed: int = 6) -> dict:
    """Counts of (κ, Δ)-SDHs over the κ grid x Δ range, with the heads listed (up to ``max_listed``).

    Returns ``{"columns": [...], "rows": [[κ, Δ, count, fraction, "l.h ..."], ...], "counts": [K, n_Δ]}``.
    Rows with a zero count are kept, so the table is the whole grid.
    """
    s = _check_slash(slash)
    L, H, S = s.shape
    hi = min(max_delta, S - 1)
    if min_delta > hi:
        raise PoslensError(f"--max-delta {max_delta}: must be >= {min_delta} and below the scan's --seq-len {S}.")
    ids = layer_ids or list(range(L))
    rows, counts = [], torch.zeros(len(kappas), hi - min_delta + 1, dtype=torch.long)
    for a, kappa in enumerate(kappas):
        for b, d in enumerate(range(min_delta, hi + 1)):
            m = s[..., d] >= kappa
            n = int(m.sum())
            counts[a, b] = n
            heads = sorted(((float(s[l, h, d]), f"{ids[l]}.{h}") for l, h in m.nonzero().tolist()), reverse=True)
            listed = " ".join(name for _, name in heads[:max_listed]) + (" ..." if n > max_listed else "")
            rows.append([float(kappa), d, n, n / (L * H), listed])
    return {"columns": ["kappa", "delta", "SDHs", "fraction of heads", "heads (layer.head, best first)"],
            "rows": rows, "counts": counts}


def persistence(slash_in, slash_random, kappa: float, max_delta: int, min_delta: int = 1,
                layer_ids: list[int] | None = None) -> list[dict]:
    """Every (κ, Δ)-SDH of the in-distribution scan (Δ in range), with its score on random tokens.

    ``persists`` is True when the head is still (κ, Δ)-dominant on random tokens; ``ratio`` is
    random / in-distribution SlashScore(Δ). Sorted by in-distribution score, descending.
    """
    a, b = _check_slash(slash_in), _check_slash(slash_random)
    if a.shape[:2] != b.shape[:2]:
        raise PoslensError(f"the two scans have different heads ({tuple(a.shape[:2])} vs {tuple(b.shape[:2])} "
                           "layers x heads); scan the same model and --layers twice.")
    hi = min(max_delta, a.shape[-1] - 1, b.shape[-1] - 1)
    ids = layer_ids or list(range(a.shape[0]))
    out = []
    for d in range(min_delta, hi + 1):
        for l, h in (a[..., d] >= kappa).nonzero().tolist():
            si, sr = float(a[l, h, d]), float(b[l, h, d])
            out.append({"layer": ids[l], "head": h, "delta": d, "score_in": si, "score_random": sr,
                        "ratio": sr / si if si > 0 else None, "persists": sr >= kappa})
    return sorted(out, key=lambda r: -r["score_in"])


def best_offsets(slash, min_delta: int = 0, max_delta: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(offset [L, H], score [L, H])`` of each head's highest SlashScore over the Δ range."""
    s = _check_slash(slash)
    hi = s.shape[-1] - 1 if max_delta is None else min(max_delta, s.shape[-1] - 1)
    window = torch.nan_to_num(s[..., min_delta: hi + 1], nan=-1.0)
    score, arg = window.max(-1)
    return arg + min_delta, score


# --------------------------------------------------------------------------------------------
# rank measures
# --------------------------------------------------------------------------------------------
def kv_head_of(h: int, num_heads: int, num_kv_heads: int) -> int:
    """The KV head a query head reads (transformers' repeat_interleave grouping)."""
    return h // (num_heads // num_kv_heads)


def rank_table(q_gram, k_gram) -> dict[str, torch.Tensor]:
    """Rank-one measures per head: ``q_*`` ``[L, H]`` and ``k_*`` ``[L, H]`` (the KV head each query head reads).

    Keys: ``{q,k}_top1_energy`` (σ1²/Σσ²), ``{q,k}_effective_rank`` (exp entropy), ``{q,k}_n95``.
    """
    qg, kg = _t(q_gram), _t(k_gram)
    if qg.ndim != 4 or kg.ndim != 4 or qg.shape[-1] != kg.shape[-1] or qg.shape[1] % kg.shape[1]:
        raise PoslensError(f"q_gram {tuple(qg.shape)} / k_gram {tuple(kg.shape)}: expected [L, H, D, D] and "
                           "[L, Hk, D, D] with Hk dividing H (maps.safetensors of `poslens scan`).")
    H, Hk = qg.shape[1], kg.shape[1]
    rq, rk = rank_measures(qg), rank_measures(kg)
    idx = torch.tensor([kv_head_of(h, H, Hk) for h in range(H)])
    out = {f"q_{k}": v for k, v in rq.items()}
    out.update({f"k_{k}": v[:, idx] for k, v in rk.items()})
    return out


# --------------------------------------------------------------------------------------------
# RoPE decomposition
# --------------------------------------------------------------------------------------------
def top_direction(gram) -> tuple[torch.Tensor, float]:
    """Top eigenvector (unit, sign arbitrary) and eigenvalue of one symmetric ``[D, D]`` matrix."""
    g = _t(gram)
    g = 0.5 * (g + g.T)
    ev, vec = torch.linalg.eigh(g)
    return vec[:, -1], float(ev[-1].clamp_min(0.0))


def pair_polar(u, rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(|u_l|, arg u_l)`` of the rotary pairs ``u_l = u[l] + i u[l + r/2]`` (rotate_half layout)."""
    u = _t(u)
    half = rotary_dim // 2
    z = torch.complex(u[..., :half], u[..., half:rotary_dim])
    return z.abs(), z.angle()


def rank_one_logit(A, phi, theta, offsets) -> torch.Tensor:
    """``Σ_l A_l cos(θ_l Δ + φ_l)`` for every Δ in ``offsets``; returns ``[len(offsets)]``."""
    d = _t(offsets)
    return (_t(A)[None, :] * torch.cos(d[:, None] * _t(theta)[None, :] + _t(phi)[None, :])).sum(-1)


def causal_pair_mean(values_by_offset: torch.Tensor, S: int) -> torch.Tensor:
    """Mean over causal pairs j <= i < S of a function of Δ = i - j given as ``[..., S]`` (Δ has S - Δ pairs)."""
    w = (S - torch.arange(S, dtype=torch.float64))
    return (values_by_offset * w).sum(-1) / w.sum()


def predicted_slash_profile(logit_by_offset, S: int | None = None) -> torch.Tensor:
    """SlashScore(Δ) of a head whose logit depends on Δ = i - j alone, under the causal softmax.

    Row i attends to Δ = 0..i with weights softmax(logit[0..i]); SlashScore(Δ) is the mean of
    row i's weight at Δ over rows i >= Δ, exactly as the scan accumulates it.
    """
    z = _t(logit_by_offset)
    S = z.shape[-1] if S is None else S
    z = z[:S]
    lse = torch.logcumsumexp(z, 0)  # [S] row normalisers: row i sums over Δ = 0..i
    p = torch.exp(z[None, :] - lse[:, None])  # [row i, Δ]
    valid = torch.arange(S)[None, :] <= torch.arange(S)[:, None]
    p = torch.where(valid, p, torch.zeros((), dtype=p.dtype))
    return p.sum(0) / (S - torch.arange(S, dtype=torch.float64))


@dataclass
class RopeDecomposition:
    """Rank-one RoPE reading of one head (see the module docstring)."""

    A: torch.Tensor  # [r/2] amplitudes, logit units (sign folded into phi)
    phi: torch.Tensor  # [r/2] phases
    theta: torch.Tensor  # [r/2] frequencies
    bands: list[str]  # [r/2] band labels
    sign: int  # sign of the coefficient product a·b read from dim_logit
    coherence: float | None  # fitted E[a b] / sqrt(E a² E b²) from dim_logit (1: constant coefficients)
    pair_fit: float | None  # cosine between observed and rank-one per-pair logit contributions
    logit: torch.Tensor  # [S] predicted logit by offset
    profile: torch.Tensor  # [S] predicted SlashScore(Δ)

    def band_usage(self) -> dict[str, float]:
        tot = float(self.A.sum()) or 1.0
        return {b: float(sum(a for a, lab in zip(self.A.tolist(), self.bands) if lab == b)) / tot for b in BANDS}

    def band_peak_contribution(self, delta: int) -> dict[str, float]:
        S = self.logit.shape[-1]
        offs = torch.arange(S, dtype=torch.float64)
        out = {}
        for b in BANDS:
            idx = [l for l, lab in enumerate(self.bands) if lab == b]
            if not idx:
                out[b] = 0.0
                continue
            c = rank_one_logit(self.A[idx], self.phi[idx], self.theta[idx], offs)
            out[b] = float(c[delta] - c.mean())
        return out


def rope_decomposition(q_gram, k_gram, dim_logit, *, rotary_dim: int, base: float | None, scaling: float,
                       seq_len: int, theta=None, attention_scaling: float = 1.0) -> RopeDecomposition:
    """Rank-one RoPE decomposition of one head from its ``q_gram [D, D]``, its KV head's
    ``k_gram [D, D]`` and its ``dim_logit [D]`` (see the module docstring).

    ``theta`` is the model's own ``inv_freq`` (as the scan records it: scaled RoPE, Gemma 3's two
    bases); without it ``base^(-2l/r)`` is recomputed. ``attention_scaling`` is the factor the model's
    rotary module multiplies cos/sin by (YaRN, LongRoPE): the logit carries its square."""
    if theta is not None:
        rotary_dim = 2 * len(theta)
    u, lam_q = top_direction(q_gram)
    v, lam_k = top_direction(k_gram)
    if rotary_dim < 2 or rotary_dim > u.shape[0] or rotary_dim % 2:
        raise PoslensError(f"rotary dimension {rotary_dim} does not fit head_dim {u.shape[0]}.")
    half = rotary_dim // 2
    mu, au = pair_polar(u, rotary_dim)
    mv, av = pair_polar(v, rotary_dim)
    theta = inv_freq(rotary_dim, base) if theta is None else _t(theta)
    mag = scaling * attention_scaling ** 2 * math.sqrt(lam_q * lam_k)
    A_unit = mu * mv
    phi = au - av
    S = int(seq_len)
    offs = torch.arange(S, dtype=torch.float64)
    # Per-pair mean logit over causal pairs for unit coefficients: the rank-one prediction of
    # dim_logit's pair sums, up to the scalar E[a b]·scaling. Its sign is the sign of a·b.
    per_pair = A_unit[:, None] * torch.cos(offs[None, :] * theta[:, None] + phi[:, None])  # [half, S]
    g = causal_pair_mean(per_pair, S)  # [half]
    dl = _t(dim_logit)
    obs = dl[:half] + dl[half:rotary_dim]
    gg = float((g * g).sum())
    fit = float((obs * g).sum()) / gg if gg > 0 else 0.0
    sign = -1 if fit < 0 else 1
    denom = float(obs.norm() * g.norm())
    pair_fit = float((obs * g).sum()) / denom if denom > 0 else None
    coherence = fit / mag if mag > 0 else None
    A = mag * A_unit
    phi = phi + (math.pi if sign < 0 else 0.0)
    logit = rank_one_logit(A, phi, theta, offs)
    bands = frequency_bands(rotary_dim, base, S, theta=theta)
    return RopeDecomposition(A=A, phi=phi, theta=theta, bands=bands, sign=sign, coherence=coherence,
                             pair_fit=pair_fit, logit=logit, profile=predicted_slash_profile(logit))


def decompose_scan(maps: dict, *, rotary_dim: int | None, base: float | None, scaling: float,
                   rope_layers: list[bool], min_delta: int = 1, max_delta: int | None = None,
                   layer_ids: list[int] | None = None, rope: dict | None = None) -> list[dict]:
    """RoPE decomposition of every head of every RoPE layer of a scan; one dict per head.

    ``rope`` is the scan's record of the model's own RoPE tables (summary ``rope``:
    :func:`poslens.capture.adapters.rope_tables`); each layer then uses its table's ``inv_freq`` and
    ``attention_scaling``. Without it ``rotary_dim`` and ``base`` recompute the frequencies.

    Each dict: layer, head, observed/predicted peak offset (Δ in ``min_delta..max_delta``) and
    their SlashScores, the profile correlation, sign/coherence/pair_fit, band usage and the
    bands' contributions at the predicted peak. ``profile`` (predicted ``[S]``) is included.
    """
    slash = _check_slash(maps["slash"])
    L, H, S = slash.shape
    Hk = maps["k_gram"].shape[1]
    hi = S - 1 if max_delta is None else min(max_delta, S - 1)
    ids = layer_ids or list(range(L))
    out = []
    from poslens.capture.adapters import layer_rope

    for li in range(L):
        if not rope_layers[li]:
            continue
        table = layer_rope(rope, ids[li])
        own = dict(theta=table["inv_freq"], attention_scaling=table["attention_scaling"]) if table else {}
        if not own and not rotary_dim:
            continue
        for h in range(H):
            dec = rope_decomposition(maps["q_gram"][li, h], maps["k_gram"][li, kv_head_of(h, H, Hk)],
                                     maps["dim_logit"][li, h], rotary_dim=rotary_dim, base=base,
                                     scaling=scaling, seq_len=S, **own)
            obs = slash[li, h]
            w_obs = obs[min_delta: hi + 1]
            w_pred = dec.profile[min_delta: hi + 1]
            d_obs = int(w_obs.argmax()) + min_delta
            d_pred = int(w_pred.argmax()) + min_delta
            corr = float(torch.corrcoef(torch.stack([w_obs, w_pred]))[0, 1]) if w_obs.numel() > 1 else None
            out.append({
                "layer": ids[li], "head": h,
                "observed_peak": d_obs, "observed_score": float(obs[d_obs]),
                "predicted_peak": d_pred, "predicted_score": float(dec.profile[d_pred]),
                "predicted_score_at_observed_peak": float(dec.profile[d_obs]),
                "peak_match": d_obs == d_pred,
                "profile_corr": corr if corr == corr else None,  # NaN (constant profile) -> None
                "sign": dec.sign, "coherence": dec.coherence, "pair_fit": dec.pair_fit,
                "band_usage": dec.band_usage(), "band_peak_contribution": dec.band_peak_contribution(d_pred),
                "profile": dec.profile,
            })
    return out


# --------------------------------------------------------------------------------------------
# the `poslens slash` run directory
# --------------------------------------------------------------------------------------------
@dataclass
class SlashConfig:
    scan_dir: str
    out: str
    random_scan: str | None = None
    kappa: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
    persist_kappa: float | None = None  # κ of the persistence test (default: the smallest κ >= 0.3 in the grid)
    min_delta: int = 1
    max_delta: int = 16
    model_dir: str | None = None  # where the scanned model's config.json is (default: the scan's model_dir)
    top: int = 20  # heads listed in the per-head table
    figures: bool = True


def model_rope_geometry(model_dir: str) -> dict:
    """``rotary_dim``, ``base``, ``scaling`` (logit scale) and ``head_dim`` of a model directory's config."""
    from transformers import AutoConfig

    from poslens.capture.adapters import get_adapter
    from poslens.capture.model_source import model_directory

    p = model_directory(model_dir)  # a .gguf file: its dequantised cache directory
    if not (p / "config.json").is_file():
        raise PoslensError(f"model directory {p} (recorded by the scan) has no config.json; pass --model-dir "
                           "with the scanned model's directory.")
    config = AutoConfig.from_pretrained(str(p))
    ad = get_adapter(config)
    D = ad.head_dim(config)
    qpas = getattr(config, "query_pre_attn_scalar", None)
    return {"rotary_dim": ad.rotary_dim(config), "base": ad.rope_base(config), "head_dim": D,
            "scaling": float(qpas) ** -0.5 if qpas else D ** -0.5, "model_type": ad.model_type,
            "num_kv_heads": ad.num_kv_heads(config)}


def _fmt(v, nd=4):
    return None if v is None else round(float(v), nd)


def analyze_scans(maps: dict, geometry: dict, rope_flags: list[bool], layer_ids: list[int], cfg: SlashConfig,
                  maps_random: dict | None = None) -> tuple[dict, dict]:
    """All slash numbers of one scan (and its random-token twin): ``(summary parts, tensors)``."""
    slash = _check_slash(maps["slash"])
    L, H, S = slash.shape
    hi = min(cfg.max_delta, S - 1)
    if cfg.min_delta < 0 or cfg.min_delta > hi:
        raise PoslensError(f"--min-delta {cfg.min_delta} / --max-delta {cfg.max_delta}: need 0 <= min <= max < "
                           f"the scan's --seq-len {S}.")
    kappas = sorted(float(k) for k in cfg.kappa)
    tab = sdh_table(slash, kappas, hi, cfg.min_delta, layer_ids)
    counts = tab["counts"]
    by_delta = []
    for b, d in enumerate(range(cfg.min_delta, hi + 1)):
        listed = next(r[4] for r in tab["rows"] if r[0] == kappas[0] and r[1] == d)
        by_delta.append([d] + [int(counts[a, b]) for a in range(len(kappas))] + [listed])
    ranks = rank_table(maps["q_gram"], maps["k_gram"])
    dec_rows = []
    if (geometry.get("rotary_dim") or geometry.get("rope")) and any(rope_flags):
        dec_rows = decompose_scan(maps, rotary_dim=geometry["rotary_dim"], base=geometry["base"],
                                  scaling=geometry["scaling"], rope_layers=rope_flags, min_delta=cfg.min_delta,
                                  max_delta=hi, layer_ids=layer_ids, rope=geometry.get("rope"))
    dec = {(r["layer"], r["head"]): r for r in dec_rows}
    d_best, s_best = best_offsets(slash, cfg.min_delta, hi)
    heads = []
    predicted = torch.full_like(slash, float("nan"))
    for li in range(L):
        for h in range(H):
            r = dec.get((layer_ids[li], h))
            if r is not None:
                predicted[li, h] = r["profile"]
            heads.append({
                "layer": layer_ids[li], "head": h, "best_delta": int(d_best[li, h]), "best_score": float(s_best[li, h]),
                **{k: float(v[li, h]) for k, v in ranks.items()},
                **({k: v for k, v in r.items() if k not in ("layer", "head", "profile")} if r else {}),
            })
    pk = cfg.persist_kappa if cfg.persist_kappa is not None else next((k for k in kappas if k >= 0.3), kappas[-1])
    pers = None
    if maps_random is not None:
        pers = persistence(slash, maps_random["slash"], pk, hi, cfg.min_delta, layer_ids)
    tensors = {"slash": slash, "slash_predicted": predicted, **{f"rank_{k}": v for k, v in ranks.items()}}
    if maps_random is not None:
        tensors["slash_random"] = _check_slash(maps_random["slash"])
    return {"kappas": kappas, "by_delta": by_delta, "heads": heads, "persist_kappa": pk, "persistence": pers,
            "max_delta": hi}, tensors


def _profiles_figure(slash, predicted, heads, layer_ids, max_delta, n=8, random=None):
    import matplotlib.pyplot as plt

    top = sorted(heads, key=lambda r: -r["best_score"])[:n]
    cols = min(4, len(top))
    rows = (len(top) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.6 * rows), squeeze=False)
    d = list(range(0, max_delta + 1))
    for ax, r in zip(axes.flat, top):
        li = layer_ids.index(r["layer"])
        ax.plot(d, slash[li, r["head"], : max_delta + 1].tolist(), "o-", ms=3, label="observed")
        if random is not None:
            ax.plot(d, random[li, r["head"], : max_delta + 1].tolist(), "s--", ms=3, label="random tokens")
        pr = predicted[li, r["head"], : max_delta + 1]
        if bool(torch.isfinite(pr).all()):
            ax.plot(d, pr.tolist(), "-", color="k", lw=1, label="rank-one RoPE")
        ax.set_title(f"layer {r['layer']} head {r['head']} (layers from 0)", fontsize=9)
        ax.set_xlabel("Δ")
        ax.set_ylabel("SlashScore")
    for ax in list(axes.flat)[len(top):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def run_slash(cfg: SlashConfig) -> dict:
    """Analyse a scan (and optionally its random-token twin) and write the run directory ``cfg.out``."""
    from poslens.analysis.panels import load_scan
    from poslens.rundir import (prepare_out_dir, save_figure, staged_dir, versions, write_json,
                                write_summary, write_tensors)

    maps, scfg, ssum = load_scan(cfg.scan_dir)
    for need in ("slash", "q_gram", "k_gram", "dim_logit"):
        if need not in maps:
            raise PoslensError(f"SCAN_DIR {cfg.scan_dir}: maps.safetensors lacks {need!r}; rescan with this poslens.")
    maps_r = None
    if cfg.random_scan:
        maps_r, rcfg, _ = load_scan(cfg.random_scan)
        if maps_r["slash"].shape[:2] != maps["slash"].shape[:2]:
            raise PoslensError(f"--random-scan {cfg.random_scan}: its slash tensor {tuple(maps_r['slash'].shape)} does "
                               f"not match {tuple(maps['slash'].shape)}; scan the same model and --layers.")
        src = (rcfg.get("source") or {}).get("kind")
        if src not in (None, "random"):
            raise PoslensError(f"--random-scan {cfg.random_scan} was scanned on --data {src}, not random tokens; "
                               "rescan with --data random.")
    if not cfg.kappa or any(not 0 < k <= 1 for k in cfg.kappa):
        raise PoslensError(f"--kappa {list(cfg.kappa)}: give thresholds in (0, 1], e.g. 0.1,0.3,0.5.")
    model_dir = cfg.model_dir or (scfg.get("options") or {}).get("model_dir")
    if not model_dir:
        raise PoslensError(f"SCAN_DIR {cfg.scan_dir}: config.json does not name the model; pass --model-dir.")
    geom = model_rope_geometry(model_dir)
    if ssum.get("rope"):  # the frequencies the scanned model actually used (scaled RoPE, per-layer-type bases)
        geom["rope"] = ssum["rope"]
    used = [x for x in ((ssum.get("attention") or {}).get("scaling") or []) if x]
    if used and len(set(used)) == 1:  # the logit scale the layers used (Granite's multiplier, Gemma's scalar)
        geom["scaling"] = used[0]
    prepare_out_dir(cfg.out)
    L, H, S = maps["slash"].shape
    layer_ids = ssum["_meta"].get("layers") or list(range(L))
    rope_flags = [bool(r.get("rope", True)) for r in ssum.get("layers", [])] or [geom["rotary_dim"] is not None] * L
    parts, tensors = analyze_scans(maps, geom, rope_flags, layer_ids, cfg, maps_r)
    heads = parts["heads"]
    top = sorted(heads, key=lambda r: -r["best_score"])[: cfg.top]
    f = _fmt
    head_cols = ["layer.head", "best Δ", "SlashScore", "q σ1²/Σσ²", "k σ1²/Σσ²", "q eff. rank", "k eff. rank",
                 "q n95", "k n95", "predicted Δ", "profile corr", "coherence", "band use high/med/low"]
    head_rows = []
    for r in top:
        bu = r.get("band_usage")
        head_rows.append([f"{r['layer']}.{r['head']}", r["best_delta"], f(r["best_score"]), f(r["q_top1_energy"], 3),
                          f(r["k_top1_energy"], 3), f(r["q_effective_rank"], 2), f(r["k_effective_rank"], 2),
                          int(r["q_n95"]), int(r["k_n95"]), r.get("predicted_peak"), f(r.get("profile_corr"), 3),
                          f(r.get("coherence"), 3),
                          "/".join(f"{bu[b]:.2f}" for b in BANDS) if bu else None])
    tables = [
        {"title": f"number of (κ, Δ)-slash-dominant heads (of {L * H})",
         "columns": ["Δ"] + [f"κ={k:g}" for k in parts["kappas"]] + [f"heads at κ={parts['kappas'][0]:g}"],
         "rows": parts["by_delta"]},
        {"title": f"top {len(top)} heads by SlashScore over Δ = {cfg.min_delta}..{parts['max_delta']}: rank-one "
                  "measures of pre-RoPE q/k and the RoPE decomposition (layer.head: decoder layers from 0)",
         "columns": head_cols, "rows": head_rows},
    ]
    if parts["persistence"] is not None:
        tables.append({"title": f"persistence on random-token prompts of the ({parts['persist_kappa']:g}, Δ)-SDHs "
                                "(layer.head: decoder layers from 0)",
                       "columns": ["layer.head", "Δ", "in-distribution", "random tokens", "ratio", "persists"],
                       "rows": [[f"{p['layer']}.{p['head']}", p["delta"], f(p["score_in"]), f(p["score_random"]),
                                 f(p["ratio"], 3), p["persists"]] for p in parts["persistence"]]})
    summary = {
        "experiment": "slash", "paper": "slash",
        "title": f"Slash-dominant heads of {ssum.get('model_type', geom['model_type'])} "
                 f"({ssum.get('num_seqs', '?')} x {S} tokens" + (", with random-token control)" if maps_r else ")"),
        "scan_dir": str(cfg.scan_dir), "random_scan": cfg.random_scan, "model_dir": str(model_dir),
        "geometry": geom, "kappas": parts["kappas"], "persist_kappa": parts["persist_kappa"],
        "delta_range": [cfg.min_delta, parts["max_delta"]],
        "seq_len": S, "sdh_counts": parts["by_delta"], "persistence": parts["persistence"], "heads": heads,
        "layer_convention": LAYER_CONVENTION, "tables": tables,
        "figures": [{"file": "slash_profiles.png", "caption": "SlashScore(Δ) of the most slash-dominant heads: observed"
                     + (", on random tokens" if maps_r else "") + " and predicted by the rank-one RoPE decomposition."}]
        if cfg.figures else [],
    }
    summary["readings"] = slash_command_readings(summary)
    with staged_dir(cfg.out) as stage:
        write_json(stage / "config.json", {"command": "slash", **dataclasses.asdict(cfg), "versions": versions()})
        write_tensors(stage / "slash.safetensors", {k: v.to(torch.float32) for k, v in tensors.items()},
                      metadata={"layers": layer_ids})
        if cfg.figures:
            save_figure(_profiles_figure(maps["slash"], tensors["slash_predicted"], heads, layer_ids, parts["max_delta"],
                                         random=maps_r["slash"] if maps_r else None), stage / "slash_profiles.png")
        write_summary(stage, summary, command="slash", layers_describe="per head under 'heads': each head's decoder "
                      "layer (from 0) and head index; 'layer.head' in tables")
    return summary
