"""The summary contract: one shape of ``summary.json`` for every command (:func:`envelope`,
:func:`write_summary`), the layer convention and the figures' captions and roles."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping

from poslens.conventions import LAYER_CONVENTION
from poslens.rundir.io import write_json

# --------------------------------------------------------------------------------------------
# The summary contract: one shape for every command, one reader for every run
# --------------------------------------------------------------------------------------------
#: version of the common summary shape written by :func:`write_summary`
CONTRACT = 1

#: captions of the figure files commands write under fixed names (``summary["figures"]`` may
#: also give its own caption per file, which wins)
FIGURE_CAPTIONS = [
    (re.compile(r"^scores(_layers[\d-]+)?_raw\.png$"),
     "Mean pre-softmax attention scores per layer (rows: query position, columns: key position; "
     "the blank upper triangle is masked)."),
    (re.compile(r"^scores(_layers[\d-]+)?_diagnorm\.png$"),
     "Diagonal-normalised scores: each diagonal's mean removed. A purely relative map is uniform here; "
     "structure that remains depends on absolute position."),
    (re.compile(r"^scores(_layers[\d-]+)?_zoom\.png$"),
     "The first 64 query and key positions of the score maps, where attention sinks (key 0) and "
     "slashes (sub-diagonals) live."),
    (re.compile(r"^probs\.png$"), "Mean attention weights (post-softmax) per layer."),
    (re.compile(r"^kim_fig1\.png$"), "Closed-form layer-2 scores of the parameter-free model (alpha = 0, length 3)."),
    (re.compile(r"^compare_layers\.png$"),
     "Each per-layer reading by decoder layer (from 0) at the longest length, for A (solid, with a band of ± the "
     "noise floor z·SE of the paired difference) and B (dashed); changed layers ringed."),
    (re.compile(r"^compare_change_(\w+)\.png$"),
     "The paired change B − A of a per-head reading by decoder layer (from 0) and head at the longest length, on a "
     "diverging scale centred on 0; grey hatched cells: unchanged (within the noise floor or under the threshold)."),
    (re.compile(r"^compare_lengths\.png$"),
     "Each reading's mean over decoder layers (the loss: over all positions) against sequence length, A and B; the "
     "dotted line marks the trained context."),
    (re.compile(r"^compare_loss\.png$"),
     "Next-token loss by position bucket (bucket middle, log scale) for A (solid) and B (dashed) at each length; "
     "the dotted line marks the trained context."),
]
_FIGURE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".svg", ".webp")

#: what a figure is for, so the report can keep the page short (a summary's own ``role`` wins):
#: ``main`` (shown), ``detail`` (kept in the run directory and named on the page, not shown),
#: ``per-layer`` (the same numbers as the summary's per-layer list, which the report draws as line
#: plots itself), ``zoom`` (a zoom on the first positions: shown only where the map is much larger)
FIGURE_ROLES = [
    (re.compile(r"^probs\.png$"), "detail"),
    (re.compile(r"^cosine_maps_bidirectional\.png$"), "detail"),
    (re.compile(r"^aps_by_layer\.png$"), "per-layer"),
    (re.compile(r"^scores(_layers[\d-]+)?_zoom\.png$"), "zoom"),
]
ROLES = ("main", "detail", "per-layer", "zoom")


def figure_role(name: str) -> str:
    """The standard role of a figure file name (``main`` when none is known)."""
    base = Path(name).name
    return next((role for pat, role in FIGURE_ROLES if pat.match(base)), "main")


def figure_caption(name: str) -> str:
    """The standard caption of a figure file name (its name when none is known)."""
    base = Path(name).name
    for pat, cap in FIGURE_CAPTIONS:
        if pat.match(base):
            return cap
    return base


def normalize_figures(figures: Any = None, files: Any = None) -> list[dict]:
    """``[{"file", "caption", "role"}]`` from a list of names or dicts (or, without one, the image
    files in a ``files`` list); ``role`` as the dict gives it, else :func:`figure_role`."""
    out: list[dict] = []
    if isinstance(figures, list):
        for f in figures:
            if isinstance(f, str):
                out.append({"file": f, "caption": figure_caption(f), "role": figure_role(f)})
            elif isinstance(f, dict) and isinstance(f.get("file"), str):
                role = f.get("role") if f.get("role") in ROLES else figure_role(f["file"])
                out.append({"file": f["file"], "caption": str(f.get("caption") or figure_caption(f["file"])),
                            "role": role})
    elif isinstance(files, list):
        out = [{"file": f, "caption": figure_caption(f), "role": figure_role(f)} for f in files
               if isinstance(f, str) and Path(f).suffix.lower() in _FIGURE_SUFFIXES]
    return out


def envelope(summary: Mapping, *, command: str, paper: str | list[str] | None = None,
             layers_describe: str | None = None, convention: str | None = None) -> dict:
    """``summary`` in the common shape every command writes (keys it already has are kept):

    - ``contract``: :data:`CONTRACT`; ``command``: the command that wrote it;
    - ``paper``: ``"kim"`` (arXiv 2509.21042), ``"slash"`` (arXiv 2601.08297), ``"neighborhood"``
      (arXiv 2501.00073), a list of them (a scan measures all three), or None;
    - ``layers``: a list of per-layer dicts, each with its ``layer`` index (an int, or
      ``"embeddings"``); ``layer_info`` says how indices count and what vectors they describe;
    - ``tables``: ``[{"title", "columns", "rows", "note"}]``; ``figures``: ``[{"file", "caption",
      "role"}]`` (:data:`FIGURE_ROLES`);
    - ``readings``: sentences (may be empty; the report derives them from the numbers);
    - NaN / masked entries as JSON null (every writer goes through :func:`write_json`).
    """
    s = dict(summary)
    s["contract"] = CONTRACT
    s["command"] = command
    if s.get("paper") is None:
        s["paper"] = paper
    layers = s.get("layers")
    s["layers"] = layers if isinstance(layers, list) else []
    info = dict(s.get("layer_info") or {})
    info["convention"] = convention or info.get("convention") or s.get("layer_convention") or LAYER_CONVENTION
    if layers_describe:
        info["describes"] = layers_describe
    info["indices"] = [l.get("layer") for l in s["layers"] if isinstance(l, dict)]
    s["layer_info"] = info
    s["tables"] = [t for t in s["tables"] if isinstance(t, dict)] if isinstance(s.get("tables"), list) else []
    s["figures"] = normalize_figures(s.get("figures"), s.get("files"))
    s.setdefault("readings", [])
    return s


def write_summary(out_dir: str | os.PathLike, summary: Mapping, *, command: str,
                  paper: str | list[str] | None = None, layers_describe: str | None = None,
                  convention: str | None = None) -> dict:
    """Atomically write ``out_dir/summary.json`` in the common shape (:func:`envelope`); returns it."""
    s = envelope(summary, command=command, paper=paper, layers_describe=layers_describe, convention=convention)
    write_json(Path(out_dir) / "summary.json", s)
    return s
