"""Render run directories into one self-contained HTML report.

``render_report(run_dirs, title)`` collects the runs (expanding folders that hold runs), groups
what they measured into one section per paper, derives plain-language readings from the numbers,
adds comparison tables where several runs of the same kind are given (NoPE vs RoPE scans, say),
and renders ``template.html.j2`` with every figure embedded as a base64 ``data:`` URI. The page
loads nothing from anywhere: its Content-Security-Policy forbids every fetch but ``data:``
images, and it has no scripts.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import math
import re
from pathlib import Path
from typing import Any, Iterable

from poslens.errors import PoslensError
from poslens.report.collect import Run, classify, collect, expand, load_run
from poslens.report.readings import (
    comparison_readings,
    kim_readings,
    model_readings,
    neighborhood_readings,
    num,
    slash_readings,
    uniform_slash,
)

#: the Content-Security-Policy of every report: no network, no scripts, images only from data: URIs
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'none'; base-uri 'none'; form-action 'none'"

PAPERS: dict[str, dict[str, str]] = {
    "kim": {
        "title": "Causal mask and RoPE: where attention scores get position",
        "ref": "arXiv 2509.21042",
        "intro": (
            "The causal mask alone, with no parameters and inputs that carry no order, makes attention scores "
            "depend on position from the second layer on, favouring nearby keys; combined with RoPE it turns "
            "RoPE's purely relative pattern (a function of the distance i − j) into a non-relative one. Heat "
            "maps have query positions as rows and key positions as columns; the blank upper triangle is "
            "masked. Numbers: the relativity index (1 = the map depends on i − j alone; 'flat' = no "
            "positional variation beyond noise) and the locality (+1 = every query's scores rise as the key "
            "gets closer, 0 = no trend)."
        ),
    },
    "slash": {
        "title": "Slash-dominant heads and RoPE",
        "ref": "arXiv 2601.08297",
        "intro": (
            "Slash-dominant heads put most of their attention on one sub-diagonal: the token Δ positions back, "
            "for every query. SlashScore(Δ) is the mean attention weight on that sub-diagonal. The paper "
            "explains them by nearly rank-one pre-RoPE queries and keys combined with RoPE's medium and high "
            "frequencies; the top-1 energy of the queries' singular values measures the first condition "
            "(1 = rank one)."
        ),
    },
    "neighborhood": {
        "title": "Position without positional encoding: similarity of nearby embeddings",
        "ref": "arXiv 2501.00073",
        "intro": (
            "In causal transformers without positional encoding, hidden vectors of nearby tokens are more "
            "cosine-similar than distant ones, already after the first attention layer and even at random "
            "initialisation. The adjacency probability score (APS) is the fraction of position triples "
            "j < k < i where token i is more similar to the nearer token k: 0.5 = chance, 1 = similarity "
            "rises monotonically towards each token."
        ),
    },
}
SECTION_ORDER = ["reproduction", "kim", "slash", "neighborhood", "models", "other"]

_CAPTIONS = [
    (re.compile(r"^scores(_layers[\d-]+)?_raw\.png$"),
     "Mean pre-softmax attention scores per layer (rows: query position, columns: key position)."),
    (re.compile(r"^scores(_layers[\d-]+)?_diagnorm\.png$"),
     "Diagonal-normalised scores: each diagonal's mean removed. A purely relative map is uniform here; "
     "structure that remains depends on absolute position."),
    (re.compile(r"^probs\.png$"), "Mean attention weights (post-softmax) per layer."),
    (re.compile(r"^kim_fig1\.png$"), "Closed-form layer-2 scores of the parameter-free model (alpha = 0, length 3)."),
]
_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
         ".svg": "image/svg+xml", ".webp": "image/webp"}


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------
def fmt(v: Any) -> str:
    """A table cell: floats to 3 decimals (or 3 significant digits when tiny/huge), None as '–'."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return "–"
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
            return f"{v:.3g}"
        return f"{v:.3f}"
    if isinstance(v, (list, tuple)):
        return ", ".join(fmt(x) for x in v)
    if isinstance(v, dict):
        return json.dumps(v, default=str)
    return str(v)


_NUMERIC = re.compile(r"^[-+−–]?[\d.,]+(e[-+]?\d+)?( ± [\d.]+)?$|^(–|flat|yes|no)$")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "x"


def table(title: str, columns: list[str], rows: Iterable[Iterable[Any]], note: str = "") -> dict:
    def cell(c):
        text = fmt(c)
        return {"v": text, "num": bool(_NUMERIC.match(text))}

    return {"title": title, "columns": [str(c) for c in columns], "rows": [[cell(c) for c in r] for r in rows],
            "note": note}


def embed_file(path: Path) -> str | None:
    """``data:`` URI of an image file, or None if it is missing or not an image."""
    mime = _MIME.get(path.suffix.lower())
    if mime is None or not path.is_file():
        return None
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if not data:
        return None
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def embed_bytes(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _inside(base: Path, rel: str) -> Path | None:
    """``base / rel`` if it stays inside ``base`` (summary files never point elsewhere)."""
    try:
        p = (base / rel).resolve()
        p.relative_to(base.resolve())
    except (ValueError, OSError):
        return None
    return p


def _default_caption(name: str) -> str:
    for pat, cap in _CAPTIONS:
        if pat.match(name):
            return cap
    return name


def run_figures(run: Run, notes: list[str] | None = None) -> list[dict]:
    """Figures a run names in ``summary["figures"]`` (names or ``{file, caption}``), else its
    PNGs listed in ``summary["files"]``, else every PNG in its directory; embedded."""
    s = run.summary
    entries: list[tuple[str, str]] = []
    figs = s.get("figures")
    if isinstance(figs, list):
        for f in figs:
            if isinstance(f, str):
                entries.append((f, _default_caption(Path(f).name)))
            elif isinstance(f, dict) and isinstance(f.get("file"), str):
                entries.append((f["file"], str(f.get("caption") or _default_caption(Path(f["file"]).name))))
    elif isinstance(s.get("files"), list):
        entries = [(f, _default_caption(Path(f).name)) for f in s["files"]
                   if isinstance(f, str) and Path(f).suffix.lower() in _MIME]
    else:
        entries = [(p.name, _default_caption(p.name)) for p in sorted(run.path.glob("*.png"))]
    out = []
    for rel, cap in entries:
        p = _inside(run.path, rel)
        uri = embed_file(p) if p is not None else None
        if uri is None:
            if notes is not None:
                notes.append(f"figure {rel} is listed but missing or unreadable; not shown.")
            continue
        out.append({"src": uri, "caption": cap, "file": rel})
    return out


def _card(run: Run, *, title: str | None = None, subtitle: str = "", badge: str = "", readings=None, tables=None,
          figures=None, meta=None, notes=None, anchor: str = "") -> dict:
    return {"id": anchor or f"run-{_slug(run.name)}", "title": title or run.name, "subtitle": subtitle,
            "badge": badge or run.command, "path": str(run.path), "readings": list(readings or []),
            "tables": list(tables or []), "figures": list(figures or []), "meta": list(meta or []),
            "notes": list(notes or [])}


# --------------------------------------------------------------------------------------------
# cards per kind of run
# --------------------------------------------------------------------------------------------
def simulate_cards(run: Run) -> list[tuple[str, dict]]:
    s, c = run.summary, run.config
    layers = [l for l in s.get("layers") or [] if isinstance(l, dict)]
    has_theory = any("theory_max_abs_diff" in l for l in layers)
    cols = ["layer", "relativity index", "locality", "max stderr"] + (["max |sim − theory|"] if has_theory else [])
    rows = []
    for l in layers:
        ri = l.get("relativity_index")
        row = [l.get("layer"), "flat" if ri is None else num(ri), l.get("locality"), num(l.get("max_stderr"))]
        if has_theory:
            row.append(num(l.get("theory_max_abs_diff")))
        rows.append(row)
    meta = [(k, fmt(c.get(k))) for k in ("alpha", "layers", "seq_len", "dim", "norm", "scale", "rope", "causal", "seed")
            if k in c]
    meta += [("samples", fmt(s.get("samples"))), ("seconds", fmt(num(s.get("seconds"))))]
    notes: list[str] = []
    if s.get("stopped_early"):
        notes.append("stopped early: every score's standard error fell below the target.")
    card = _card(run, subtitle=str(s.get("label") or ""), badge="simulate",
                 readings=kim_readings(layers, noise="Monte Carlo noise"),
                 tables=[table("Per layer", cols, rows)] if rows else [],
                 figures=run_figures(run, notes), meta=meta, notes=notes)
    return [("kim", card)]


def scan_label(run: Run) -> str:
    s = run.summary
    layers = [l for l in s.get("layers") or [] if isinstance(l, dict)]
    ropes = {bool(l.get("rope")) for l in layers if "rope" in l}
    pe = "RoPE" if ropes == {True} else "NoPE" if ropes == {False} else "partly RoPE" if ropes else ""
    ctrl = s.get("controls") or {}
    bits = [str(s.get("model_type") or ""), pe]
    if ctrl.get("bidirectional"):
        bits.append("bidirectional control")
    if ctrl.get("no_rope_layers"):
        bits.append(f"RoPE removed in layers {fmt(ctrl['no_rope_layers'])}")
    if s.get("num_seqs") is not None:
        bits.append(f"{fmt(s.get('num_seqs'))} sequences × {fmt(s.get('seq_len'))} tokens")
    src = (run.config.get("source") or {}).get("kind") if isinstance(run.config.get("source"), dict) else None
    if src:
        bits.append(f"data: {src}")
    return ", ".join(b for b in bits if b)


def scan_cards(run: Run) -> list[tuple[str, dict]]:
    s = run.summary
    layers = [l for l in s.get("layers") or [] if isinstance(l, dict)]
    label = scan_label(run)
    model = s.get("model_dir") or (run.config.get("options") or {}).get("model_dir")
    meta = [("model", fmt(model)), ("model type", fmt(s.get("model_type"))), ("sequences", fmt(s.get("num_seqs"))),
            ("tokens per sequence", fmt(s.get("seq_len")))]
    tp = s.get("throughput") or {}
    if isinstance(tp, dict) and num(tp.get("tokens_per_s")) is not None:
        meta.append(("tokens / s", fmt(num(tp.get("tokens_per_s")))))
    notes: list[str] = []
    figs = run_figures(run, notes)
    cards = []
    # arXiv 2509.21042: score maps
    rows = [[l.get("layer"), l.get("rope"), "flat" if l.get("relativity_index") is None else num(l.get("relativity_index")),
             num(l.get("locality"))] for l in layers]
    cards.append(("kim", _card(run, subtitle=label, badge="scan", anchor=f"kim-{_slug(run.name)}",
                               readings=kim_readings(layers),
                               tables=[table("Per layer", ["layer", "RoPE", "relativity index", "locality"], rows)],
                               figures=figs, meta=meta, notes=notes)))
    # Slash heads
    n = int(num(s.get("seq_len")) or 0)
    tops = [t for t in s.get("slash_top_heads_offset_ge1") or [] if isinstance(t, dict)]
    head_rows = [[t.get("layer"), t.get("head"), t.get("offset"), num(t.get("score")),
                  uniform_slash(n, int(t.get("offset") or 0)) if n else None] for t in tops]
    rank_rows = []
    for l in layers:
        q = [num(v) for v in l.get("q_top1_energy") or [] if num(v) is not None]
        k = [num(v) for v in l.get("k_top1_energy") or [] if num(v) is not None]
        qe = [num(v) for v in l.get("q_effective_rank") or [] if num(v) is not None]
        bands = l.get("band_logit") if isinstance(l.get("band_logit"), dict) else {}
        band_txt = ", ".join(f"{b} {sum(num(x) or 0 for x in v) / max(len(v), 1):+.3g}" for b, v in bands.items()
                             if isinstance(v, list))
        rank_rows.append([l.get("layer"), max(q) if q else None, sum(q) / len(q) if q else None, max(k) if k else None,
                          sum(qe) / len(qe) if qe else None, band_txt or None])
    slash_tables = []
    if head_rows:
        slash_tables.append(table("Strongest slash heads (offset ≥ 1)",
                                  ["layer", "head", "offset Δ", "SlashScore(Δ)", "uniform attention"], head_rows,
                                  note="uniform attention: the SlashScore a head attending equally to every "
                                       "visible key would get at that offset."))
    if rank_rows:
        slash_tables.append(table("Rank-one measures of pre-RoPE queries and keys, per layer",
                                  ["layer", "q top-1 energy (max head)", "q top-1 energy (mean)",
                                   "k top-1 energy (max)", "q effective rank (mean)", "mean logit by RoPE band"],
                                  rank_rows))
    cards.append(("slash", _card(run, subtitle=label, badge="scan", anchor=f"slash-{_slug(run.name)}",
                                 readings=slash_readings(s), tables=slash_tables)))
    # Neighbourhood: APS
    aps_rows = []
    if num(s.get("embedding_aps")) is not None:
        aps_rows.append(["embeddings", num(s.get("embedding_aps")), None, None])
    aps_rows += [[l.get("layer"), num(l.get("aps")), num(l.get("attn_aps")), num(l.get("norm_score"))] for l in layers]
    cards.append(("neighborhood", _card(run, subtitle=label, badge="scan", anchor=f"nb-{_slug(run.name)}",
                                        readings=neighborhood_readings(s),
                                        tables=[table("Adjacency probability score by layer",
                                                      ["after layer", "APS hidden states", "APS attention output",
                                                       "norm score"], aps_rows,
                                                      note=f"over the first {fmt(s.get('aps_positions'))} positions")]
                                        if layers else [])))
    return cards


def _loss_curve(run: Run) -> dict | None:
    """A loss-curve figure from ``train_log.jsonl`` (drawn here, embedded as PNG)."""
    log = run.path / "train_log.jsonl"
    if not log.is_file():
        return None
    steps, losses, ev_steps, ev_losses = [], [], [], []
    try:
        for line in log.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(r, dict):
                continue
            if r.get("kind") == "eval" and num(r.get("eval_loss")) is not None:
                ev_steps.append(r.get("step"))
                ev_losses.append(num(r["eval_loss"]))
            elif num(r.get("loss")) is not None and num(r.get("step")) is not None:
                steps.append(num(r["step"]))
                losses.append(num(r["loss"]))
    except OSError:
        return None
    if len(steps) < 2:
        return None
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.0, 3.0))
    ax.plot(steps, losses, lw=1, label="training loss")
    if ev_losses:
        ax.plot(ev_steps, ev_losses, "o-", ms=3, label="evaluation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return {"src": embed_bytes(buf.getvalue()), "caption": "Loss during training (from train_log.jsonl).",
            "file": "train_log.jsonl"}


_MODEL_KEYS = ("pe", "task", "data", "preset", "steps", "params", "params_non_embedding", "initial_loss", "final_loss",
               "eval_loss", "eval_accuracy", "eval_accuracy_long", "tokens_per_second", "device")


def model_cards(run: Run) -> list[tuple[str, dict]]:
    s, c = run.summary, run.config
    arch = [(k, fmt(c.get(k))) for k in ("model_type", "num_hidden_layers", "hidden_size", "num_attention_heads",
                                         "num_key_value_heads", "n_layer", "n_embd", "n_head", "vocab_size") if k in c]
    rows = [[k.replace("_", " "), s.get(k)] for k in _MODEL_KEYS if k in s and s.get(k) is not None]
    figs = [f for f in [_loss_curve(run)] if f]
    notes = [] if s else ["no summary.json: a model directory not written by `poslens train`; architecture only."]
    card = _card(run, subtitle=f"{c.get('model_type', '')} model", badge="model", readings=model_readings(s, c),
                 tables=[table("Training summary", ["quantity", "value"], rows)] if rows else [], figures=figs,
                 meta=arch, notes=notes)
    return [("models", card)]


def analysis_cards(run: Run) -> list[tuple[str, dict]]:
    """Any command that follows the analysis contract (experiment, title, paper, tables, readings, figures)."""
    s = run.summary
    tables = []
    for t in s.get("tables") or []:
        if not isinstance(t, dict) or not isinstance(t.get("columns"), list) or not isinstance(t.get("rows"), list):
            continue
        rows = [r if isinstance(r, list) else [r] for r in t["rows"]]
        tables.append(table(str(t.get("title") or ""), t["columns"], rows, note=str(t.get("note") or "")))
    readings = [str(r) for r in s.get("readings") or [] if isinstance(r, (str, int, float))]
    notes: list[str] = []
    figs = run_figures(run, notes)
    layers = s.get("layers")
    if isinstance(layers, list) and layers and not readings and any(
            isinstance(l, dict) and "relativity_index" in l for l in layers):
        readings = kim_readings(layers)
    paper = run.paper if run.paper in PAPERS else "other"
    subtitle = str(s.get("experiment") or "")
    card = _card(run, title=f"{s.get('title') or run.name}", subtitle=f"{subtitle} · {run.name}" if subtitle else run.name,
                 badge=run.command, readings=readings, tables=tables, figures=figs, notes=notes)
    return [(paper, card)]


def cards_for(run: Run) -> list[tuple[str, dict]]:
    if run.kind == "model":
        return model_cards(run)
    if run.command == "simulate":
        return simulate_cards(run)
    if run.command == "scan":
        return scan_cards(run)
    return analysis_cards(run)


# --------------------------------------------------------------------------------------------
# comparisons
# --------------------------------------------------------------------------------------------
def _by_layer(runs: list[Run], key: str, flat_text: str | None = None) -> tuple[list[str], list[list]]:
    layer_ids: list = []
    for r in runs:
        for l in r.summary.get("layers") or []:
            if isinstance(l, dict) and l.get("layer") not in layer_ids:
                layer_ids.append(l.get("layer"))
    rows = []
    for lid in layer_ids:
        row = [lid]
        for r in runs:
            entry = next((l for l in r.summary.get("layers") or [] if isinstance(l, dict) and l.get("layer") == lid), None)
            if entry is None:
                row.append(None)
            elif entry.get(key) is None and flat_text:
                row.append(flat_text)
            else:
                row.append(num(entry.get(key)))
        rows.append(row)
    return ["layer"] + [r.name for r in runs], rows


def _layer_series(r: Run, key: str) -> list:
    return [l.get(key) for l in r.summary.get("layers") or [] if isinstance(l, dict)]


def comparisons(runs: list[Run]) -> dict[str, list[dict]]:
    """Section -> comparison blocks ({title, readings, tables}) for groups of like runs."""
    out: dict[str, list[dict]] = {}
    for command in ("simulate", "scan"):
        group = [r for r in runs if r.kind == "command" and r.command == command and r.summary.get("layers")]
        if len(group) < 2:
            continue
        what = "simulations" if command == "simulate" else "scans"
        cols, ri_rows = _by_layer(group, "relativity_index", "flat")
        _, loc_rows = _by_layer(group, "locality", "flat")
        legend = "; ".join(f"{r.name}: {r.summary.get('label') or scan_label(r)}" for r in group)
        reads = [x for x in (comparison_readings("relativity index", {r.name: _layer_series(r, "relativity_index") for r in group}),
                             comparison_readings("locality", {r.name: _layer_series(r, "locality") for r in group})) if x]
        out.setdefault("kim", []).append({
            "title": f"Comparison of {len(group)} {what}", "legend": legend, "readings": reads,
            "tables": [table("Relativity index by layer", cols, ri_rows), table("Locality by layer", cols, loc_rows)]})
        if command == "scan":
            cols, aps_rows = _by_layer(group, "aps")
            emb = ["embeddings"] + [num(r.summary.get("embedding_aps")) for r in group]
            out.setdefault("neighborhood", []).append({
                "title": f"Comparison of {len(group)} scans", "legend": legend,
                "readings": [x for x in [comparison_readings("APS", {r.name: _layer_series(r, "aps") for r in group})] if x],
                "tables": [table("APS of hidden states by layer", cols, [emb] + aps_rows)]})
            head_rows = []
            for r in group:
                t = next((t for t in r.summary.get("slash_top_heads_offset_ge1") or [] if isinstance(t, dict)), None)
                n = int(num(r.summary.get("seq_len")) or 0)
                if t:
                    head_rows.append([r.name, t.get("layer"), t.get("head"), t.get("offset"), num(t.get("score")),
                                      uniform_slash(n, int(t.get("offset") or 0)) if n else None])
            q_rows = []
            for lid_row in _by_layer(group, "layer")[1]:
                lid = lid_row[0]
                row = [lid]
                for r in group:
                    e = next((l for l in r.summary.get("layers") or [] if isinstance(l, dict) and l.get("layer") == lid), {})
                    q = [num(v) for v in e.get("q_top1_energy") or [] if num(v) is not None]
                    row.append(max(q) if q else None)
                q_rows.append(row)
            tabs = []
            if head_rows:
                tabs.append(table("Strongest slash head (offset ≥ 1) per run",
                                  ["run", "layer", "head", "offset Δ", "SlashScore(Δ)", "uniform attention"], head_rows))
            tabs.append(table("Pre-RoPE query top-1 energy (most rank-one head) by layer", cols, q_rows))
            out.setdefault("slash", []).append({"title": f"Comparison of {len(group)} scans", "legend": legend,
                                                "readings": [], "tables": tabs})
    # analysis runs of the same experiment: stack tables that share title and columns
    groups: dict[str, list[Run]] = {}
    for r in runs:
        if r.kind == "command" and r.command not in ("simulate", "scan") and r.summary.get("experiment"):
            groups.setdefault(str(r.summary["experiment"]), []).append(r)
    for exp, group in groups.items():
        if len(group) < 2:
            continue
        tabs = []
        first = group[0].summary.get("tables") or []
        for t in first:
            if not isinstance(t, dict) or not isinstance(t.get("columns"), list):
                continue
            rows = []
            for r in group:
                match = next((u for u in r.summary.get("tables") or [] if isinstance(u, dict)
                              and u.get("title") == t.get("title") and u.get("columns") == t.get("columns")), None)
                if match is None:
                    rows = []
                    break
                rows += [[r.name] + (row if isinstance(row, list) else [row]) for row in match.get("rows") or []]
            if rows:
                tabs.append(table(f"{t.get('title') or ''} (all runs)", ["run"] + list(t["columns"]), rows))
        if tabs:
            paper = group[0].paper if group[0].paper in PAPERS else "other"
            out.setdefault(paper, []).append({"title": f"Comparison: {exp} ({len(group)} runs)", "legend": "",
                                              "readings": [], "tables": tabs})
    models = [r for r in runs if r.kind == "model" and r.summary]
    if len(models) >= 2:
        rows = [[r.name] + [r.summary.get(k) for k in ("pe", "task", "data", "steps", "params", "initial_loss",
                                                       "final_loss", "eval_accuracy", "eval_accuracy_long")]
                for r in models]
        out.setdefault("models", []).append({
            "title": f"Comparison of {len(models)} models", "legend": "", "readings": [],
            "tables": [table("Models side by side", ["model", "PE", "task", "data", "steps", "parameters",
                                                     "initial loss", "final loss", "accuracy", "accuracy (longer)"],
                             rows)]})
    return out


# --------------------------------------------------------------------------------------------
# the reproduction page
# --------------------------------------------------------------------------------------------
def reproduction_block(run: Run) -> dict:
    idx = run.index
    exps = []
    summary_rows = []
    for e in idx.get("experiments") or []:
        if not isinstance(e, dict):
            continue
        name = str(e.get("name") or "?")
        rep = e.get("reproduced")
        verdict = "reproduced" if rep is True else "not reproduced" if rep is False else "not decided"
        edir = _inside(run.path, name) if name != "?" else None
        figs, nested = [], []
        if edir is not None and edir.is_dir():
            for p in sorted(edir.glob("*")):
                if p.suffix.lower() in _MIME:
                    uri = embed_file(p)
                    if uri:
                        figs.append({"src": uri, "caption": _default_caption(p.name), "file": f"{name}/{p.name}"})
            paths, _ = expand(edir, depth=3)
            for rp in paths:
                if rp.resolve() == run.path.resolve():
                    continue
                try:
                    sub = load_run(rp)
                except PoslensError:
                    continue
                sub.name = str(rp.resolve().relative_to(run.path.resolve()))
                for _sec, c in cards_for(sub):
                    c["id"] = f"repro-{_slug(sub.name)}-{_sec}"
                    c["path"] = sub.name  # relative: the folder may be a staging copy or move later
                    nested.append(c)
        measured = e.get("measured")
        lines = measured if isinstance(measured, list) else str(measured if measured is not None else "").splitlines()
        exps.append({"id": f"exp-{_slug(name)}", "name": name, "paper": str(e.get("paper") or ""),
                     "claim": str(e.get("claim") or ""), "measured": [str(x) for x in lines if str(x).strip()],
                     "verdict": verdict, "ok": rep, "note": str(e.get("note") or ""), "figures": figs,
                     "cards": nested})
        summary_rows.append([name, str(e.get("paper") or ""), verdict])
    n_ok = sum(1 for e in exps if e["ok"] is True)
    setting = []
    if idx.get("samples") is not None:
        setting.append(f"Monte Carlo samples per simulation: {fmt(idx.get('samples'))}")
    if idx.get("seed") is not None:
        setting.append(f"seed {idx.get('seed')}")
    shown = run.display_path if run.display_path is not None else str(run.path)
    return {"id": f"repro-{_slug(run.name)}", "name": run.name, "path": shown, "experiments": exps,
            "n_ok": n_ok, "n": len(exps), "setting": ", ".join(setting),
            "table": table("Verdicts", ["experiment", "paper", "verdict"], summary_rows)}


# --------------------------------------------------------------------------------------------
# assembling the page
# --------------------------------------------------------------------------------------------
def build_context(runs: list[Run], title: str, skipped: list[str] | None = None) -> dict:
    sections: dict[str, dict] = {}

    def section(key: str) -> dict:
        if key not in sections:
            if key in PAPERS:
                p = PAPERS[key]
                sections[key] = {"id": f"sec-{key}", "title": p["title"], "ref": p["ref"], "intro": p["intro"],
                                 "cards": [], "comparisons": [], "repro": []}
            else:
                titles = {"reproduction": ("Reproduction: what the papers showed and what we measured", ""),
                          "models": ("Models", "Models trained here (or given as Hugging Face directories)."),
                          "other": ("Other results", "")}
                t, intro = titles[key]
                sections[key] = {"id": f"sec-{key}", "title": t, "ref": "", "intro": intro, "cards": [],
                                 "comparisons": [], "repro": []}
        return sections[key]

    for run in runs:
        if run.kind == "reproduce":
            section("reproduction")["repro"].append(reproduction_block(run))
            continue
        for key, card in cards_for(run):
            section(key)["cards"].append(card)
    for key, blocks in comparisons(runs).items():
        section(key)["comparisons"] += blocks
    ordered = [sections[k] for k in SECTION_ORDER if k in sections]
    from poslens import __version__ as version

    return {
        "title": title, "csp": CSP, "sections": ordered, "runs": [{"name": r.name, "path": str(r.path), "kind": r.command}
                                                                    for r in runs],
        "skipped": list(skipped or []), "generated": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "version": version,
    }


def _env():
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(__file__).parent)),
                             autoescape=jinja2.select_autoescape(["html", "j2"], default=True),
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    return env


def render_runs(runs: list[Run], title: str = "poslens report", skipped: list[str] | None = None) -> str:
    """Render already-loaded runs (see :func:`poslens.report.collect.collect`)."""
    ctx = build_context(runs, title, skipped)
    return _env().get_template("template.html.j2").render(**ctx)


def render_report(run_dirs: list[str | Path], title: str = "poslens report") -> str:
    """One self-contained HTML page for ``run_dirs`` (folders holding runs are expanded)."""
    runs, skipped = collect(list(run_dirs))
    return render_runs(runs, title, skipped)


def write_report(run_dirs: list[str | Path], out: str | Path, title: str = "poslens report") -> Path:
    """Render and atomically write the report to ``out``; returns the path."""
    from poslens.rundir import _atomic_write_bytes

    out = Path(out)
    if out.exists() and out.is_dir():
        raise PoslensError(f"--out {out} is a directory; pass a file name such as {out / 'report.html'}.")
    html = render_report(run_dirs, title)  # everything is validated before anything is written
    _atomic_write_bytes(out, html.encode("utf-8"))
    return out


def write_index_html(out_dir: str | Path, title: str = "poslens reproduction") -> Path:
    """Write ``out_dir/index.html``: the reproduction page of a folder holding ``index.json``."""
    from poslens.rundir import _atomic_write_bytes

    out_dir = Path(out_dir)
    if classify(out_dir) != "reproduce":
        raise PoslensError(f"{out_dir} holds no reproduction index.json; run `poslens reproduce` first.")
    run = load_run(out_dir)
    run.name = title
    run.display_path = ""  # the page lives in the folder it describes (which may still be a staging copy)
    html = render_runs([run], title)
    path = out_dir / "index.html"
    _atomic_write_bytes(path, html.encode("utf-8"))
    return path
