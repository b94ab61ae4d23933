"""The result of every function of :mod:`poslens.api`: :class:`Result` (a run directory as an
object: maps, summary, tables, figures) and :func:`load`, which reads one back."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from poslens.errors import PoslensError
from poslens.reporting.columns import HEAD_COLUMNS, LAYER_COLUMNS  # the columns of heads() and layers()

#: files of a run directory that are its bookkeeping, not its results (never copied by :meth:`Result.save`)
_NOT_RESULTS = ("checkpoint.safetensors",)


def _columns_doc(columns: dict) -> str:
    return "\n".join(f"    {k}: {v}" for k, v in columns.items())


class Result:
    """One finished run: ``config``, ``summary``, ``maps`` (tensors), tables and figures.

    ``path`` is where its files are: the run directory it was loaded from or written to, or a
    temporary directory (``temporary`` is then True) until :meth:`save` gives it a lasting one."""

    def __init__(self, path: str | os.PathLike, *, _tmp: tempfile.TemporaryDirectory | None = None):
        from poslens.rundir.load import load_run

        self._tmp = _tmp
        self.path = Path(path)
        run = load_run(self.path)
        if run.kind != "command":
            raise PoslensError(f"{self.path} is a {run.kind} directory, not a finished run; pass a run directory "
                               "written by a poslens command or function.")
        self._run = run
        self.command: str = run.command
        self.config: dict = run.config
        self.summary: dict = run.summary
        self._maps: dict | None = None

    @property
    def temporary(self) -> bool:
        """True while the result lives only in a temporary directory (see :meth:`save`)."""
        return self._tmp is not None

    def _model_name(self) -> str:
        s = self.summary
        if self.command == "fingerprint":
            return ", ".join(str(m) for m in (self.config.get("models") or {})) or "models"
        name = str(s.get("model_dir") or (self.config.get("options") or {}).get("model_dir") or "")
        if name.startswith("<in-memory"):
            name = name[len("<in-memory "):-1]
        name = Path(name).name if name and not name.startswith(("<", "unnamed")) and "/" in name else name
        return name or str(s.get("model_type") or "")

    def _shape(self) -> str:
        s = self.summary
        parts = []
        if s.get("num_layers") or self._run.layers:
            parts.append(f"{s.get('num_layers') or len(self._run.layers)} layers")
        heads = s.get("num_heads") or (_heads_from_maps(self._maps) if self._maps is not None else 0)
        if heads:
            parts.append(f"{heads} heads")
        if s.get("num_seqs") and s.get("seq_len"):
            parts.append(f"{s['num_seqs']} × {s['seq_len']} tokens")
        return ", ".join(parts)

    def __repr__(self) -> str:
        where = "temporary" if self.temporary else str(self.path)
        model = self._model_name()
        shape = self._shape()
        backend = f"; backend {', '.join(self.backends)}" if self.backends else ""
        return (f"<poslens.Result {self.command}" + (f" of {model}" if model else "") + (f": {shape}" if shape else "")
                + f"{backend}; at {where}>")

    def _repr_html_(self) -> str:
        """Jupyter's view: the model, the shape, the statistics, the backend, and the top heads."""
        import html

        s = self.summary
        rows = [("command", self.command), ("model", self._model_name()), ("shape", self._shape()),
                ("data", s.get("data") or (self.config.get("options") or {}).get("data")),
                ("statistics", ", ".join(s.get("stats") or []) if isinstance(s.get("stats"), list) else s.get("stats")),
                ("backend", "; ".join(f"{k} (layers {', '.join(map(str, v.get('layers', [])[:8]))}"
                                      f"{' …' if len(v.get('layers', [])) > 8 else ''})"
                                      for k, v in self.backends.items())),
                ("saved at", "temporary (see save())" if self.temporary else str(self.path))]
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td style='text-align:left'>"
                       f"{html.escape(str(v))}</td></tr>" for k, v in rows if v not in (None, ""))
        top = ""
        if self.command == "scan":
            try:
                h = self.heads()
            except (PoslensError, KeyError, ValueError):
                h = None
            if h is not None and len(h):
                parts = []
                for col, label in (("sink", "strongest sinks (weight on key 0)"),
                                   ("slash_score", "strongest slash heads (SlashScore at Δ)")):
                    t = h.dropna(subset=[col]).sort_values(col, ascending=False).head(5)
                    if len(t):
                        cells = "; ".join(f"layer {int(r.layer)}, head {int(r.head)}: {getattr(r, col):.3g}"
                                          + (f" at Δ = {int(r.slash_offset)}" if col == "slash_score" else "")
                                          for r in t.itertuples())
                        parts.append(f"<tr><th style='text-align:left'>{label}</th><td style='text-align:left'>"
                                     f"{html.escape(cells)}</td></tr>")
                top = "".join(parts)
        return f"<table><caption style='text-align:left'><b>poslens.Result</b></caption>{body}{top}</table>"

    @property
    def backends(self) -> dict:
        """Which backend computed the attention statistics of which decoder layers (from 0), and why:
        ``{"native": {"layers": [0, 1, ...], "reason": "fused C kernels"}}`` (a scan; else empty)."""
        return dict(self.summary.get("capture_backends") or {})

    # ---- tensors ---------------------------------------------------------------------------
    @property
    def maps(self) -> dict:
        """Every tensor the run wrote, by name (``maps.safetensors`` of a scan: ``scores``, ``probs``,
        ``slash``, ...); a name found in two files is prefixed with its file's stem (``file.name``)."""
        if self._maps is None:
            _check_present(self.path)
            self._maps = _read_maps(self.path)
        return self._maps

    # ---- tables ----------------------------------------------------------------------------
    def layers(self):
        """One row per layer: the per-layer readings of ``summary.json`` (``layer`` counts decoder layers
        from 0 unless ``attrs["layer_convention"]`` says otherwise). The defined columns come first, in
        this order (a scan has those of its statistics; other commands add their own after them):

{columns}
        """
        import pandas as pd

        rows = [{k: v for k, v in l.items() if not isinstance(v, (list, dict))} for l in self._run.layers]
        df = pd.DataFrame(rows)
        df = df[[c for c in LAYER_COLUMNS if c in df.columns] + [c for c in df.columns if c not in LAYER_COLUMNS]]
        df.attrs["layer_convention"] = _layer_convention(self.summary)
        return df

    def heads(self):
        """One row per (layer, head) of a scan; NaN where the scan did not collect the statistic. Columns:

{columns}
        """
        import numpy as np
        import pandas as pd

        if self.command != "scan":
            raise PoslensError(f"heads(): a {self.command} run has no per-head table; scan a model for one.")
        from poslens.metrics.slash import best_slash

        layer_ids = self._layer_ids()
        H = int(self.summary.get("num_heads") or 0) or _heads_from_maps(self.maps)
        rows = []
        for name in ("sink_heads", "slash"):  # a damaged run: one error naming the file, not an IndexError
            t = self.maps.get(name)
            if t is not None and (t.dim() != 3 or t.shape[0] != len(layer_ids) or t.shape[1] != H):
                raise PoslensError(f"{self.path / 'maps.safetensors'}: {name} has shape {list(t.shape)}, not "
                                   f"[{len(layer_ids)} layers, {H} heads, S] as summary.json says; the run is damaged, "
                                   "scan again.")
        sink = _head_sink(self.maps)
        slash = self.maps.get("slash")
        best = best_slash(slash) if slash is not None else None  # the one best-slash-head rule
        for li, layer in enumerate(layer_ids):
            for h in range(H):
                row = {"layer": layer, "head": h, "sink": float("nan"), "slash_offset": None,
                       "slash_score": float("nan")}
                if sink is not None:
                    row["sink"] = float(sink[li, h])
                if best is not None and int(best[0][li, h]) >= 0:
                    row["slash_offset"], row["slash_score"] = int(best[0][li, h]), float(best[1][li, h])
                rows.append(row)
        df = pd.DataFrame(rows, columns=list(HEAD_COLUMNS))
        df["slash_offset"] = df["slash_offset"].astype("Int64")
        df.attrs["layer_convention"] = _layer_convention(self.summary)
        return df if len(df) else df.astype({"sink": np.float64})

    layers.__doc__ = layers.__doc__.format(columns=_columns_doc(LAYER_COLUMNS))
    heads.__doc__ = heads.__doc__.format(columns=_columns_doc(HEAD_COLUMNS))

    def traits(self, level: str = "layer"):
        """A fingerprint's traits as a DataFrame: one row per (model, layer), or per model (``level="model"``)."""
        if self.command != "fingerprint":
            raise PoslensError(f"traits(): a {self.command} run has no fingerprint; run poslens.fingerprint.")
        from poslens.analysis.fingerprint import load_fingerprint

        return load_fingerprint(self.path).table(level)

    def readings(self) -> list[str]:
        """The run's readings in words, rendered from the numbers and codes of ``summary.json`` by
        :mod:`poslens.reporting.readings` (the sentences the terminal and the report show)."""
        from poslens.reporting.readings.commands import command_readings
        from poslens.reporting.readings.findings import run_readings
        from poslens.reporting.readings.notes import beyond_context_note

        beyond = [n for n in (beyond_context_note(self.summary),) if n]  # a scan past the trained context
        made = command_readings(self.command, self.summary)
        if made is not None:
            return beyond + made
        papers = self.summary.get("paper") or []
        papers = [papers] if isinstance(papers, str) else list(papers)
        return beyond + [r for paper in papers for r in run_readings(self.command, papers, self.summary, paper)]

    def tables(self) -> dict:
        """The run's tables as DataFrames, by name: those of its summary (an ablation's ``conditions``, ...);
        a run whose summary has none but rows per layer (a scan) gives ``layers`` (:meth:`layers`) and, for
        a scan, ``heads`` (:meth:`heads`)."""
        import pandas as pd

        out = {t.get("name") or f"table{i}": pd.DataFrame(t["rows"], columns=t["columns"])
               for i, t in enumerate(self._run.tables)}
        if not out and self._run.layers:
            out["layers"] = self.layers()
            if self.command == "scan":
                out["heads"] = self.heads()
        return out

    def _layer_ids(self) -> list:
        ids = [l.get("layer") for l in self._run.layers]
        if ids:
            return ids
        spec = self.summary.get("layers_scanned") or self.config.get("options", {}).get("layers")
        return list(spec) if spec else list(range(int(self.summary.get("num_layers") or 0)))

    # ---- figures ---------------------------------------------------------------------------
    def plot(self, name: str = "scores", layer: int | None = None, *, head: int | None = None,
             diagonal_normalized: bool = False, ax=None):
        """A matplotlib Figure of map ``name`` (``scores``, ``probs``, ``cosine``, ``attn_cosine`` ...) of
        decoder layer ``layer`` (counted from 0; default: the first). ``slash``: the SlashScore profile
        of every head of the layer (or of ``head``). ``diagonal_normalized``: each diagonal minus its own
        mean (arXiv 2509.21042's view of the non-relative part). The causal mask's triangle is blank. In
        Jupyter the figure shows itself (a :class:`poslens.figures.NotebookFigure`), no magic needed."""
        import torch

        from poslens.figures import notebook_figure

        if name not in self.maps:
            raise PoslensError(f"plot({name!r}): this {self.command} run has no map {name!r}; it has "
                               f"{', '.join(sorted(self.maps)) or 'none'}.")
        m = self.maps[name]
        ids = self._layer_ids()
        if name == "cosine" and m.shape[0] == len(ids) + 1:  # index 0: the embeddings
            ids = ["embeddings", *ids]
        li = 0 if layer is None else _index_of(layer, ids, name)
        own = ax is None
        fig, ax = (ax.figure, ax) if ax is not None else notebook_figure(figsize=(5.2, 4.2))
        if own:  # laid out as drawn: a plain fig.savefig(path) keeps the legend beside the axes in the image
            fig.set_layout_engine("constrained")
        if name == "slash":
            prof = m[li].double().numpy()
            for h in range(prof.shape[0]) if head is None else [head]:
                ax.plot(range(prof.shape[-1]), prof[h], lw=1, label=f"head {h}")
            ax.set_xscale("symlog", linthresh=16)
            ax.set_xlabel("offset Δ (query − key)")
            ax.set_ylabel("SlashScore(Δ)")
            if head is not None or prof.shape[0] <= 16:  # beside the axes, never over the curves
                ax.legend(fontsize=7, ncol=1 if prof.shape[0] <= 8 else 2, loc="upper left", bbox_to_anchor=(1.02, 1),
                          frameon=False)
        else:
            x = m[li].double()
            if x.dim() != 2:
                raise PoslensError(f"plot({name!r}): the map is {list(m.shape)}, not one S x S map per layer.")
            if diagonal_normalized:
                from poslens.metrics import diagonal_normalize

                x = diagonal_normalize(x)
            upper = torch.triu(torch.ones_like(x, dtype=torch.bool), 1)
            if x.shape[0] == x.shape[1] and not bool((x[upper].nan_to_num(0.0) != 0).any()):
                x = x.masked_fill(upper, float("nan"))  # the causal mask's triangle: blank, not the value 0
            finite = x[x.isfinite()]
            lo, hi = (float(finite.quantile(0.01)), float(finite.quantile(0.99))) if finite.numel() else (0, 1)
            im = ax.imshow(x.numpy(), cmap="viridis", vmin=lo, vmax=hi, interpolation="nearest")
            fig.colorbar(im, ax=ax, shrink=0.85)
            ax.set_xlabel("key position")
            ax.set_ylabel("query position")
        title = f"{name}{' (diagonal-normalised)' if diagonal_normalized else ''}, layer {ids[li]}"
        ax.set_title(title + (f", head {head}" if head is not None else ""), fontsize=9)
        return fig

    def explore(self, *others, out: str | os.PathLike | None = None, overwrite: bool = False):
        """An interactive page of this run (and ``others``, e.g. its random-token control scan): a
        :class:`poslens.Explorer`, shown inline in Jupyter, written to ``out`` when given (``poslens explore``)."""
        from poslens.explorer import build

        page = build([self, *(o if isinstance(o, Result) else load(o) for o in others)])
        if out is not None:
            page.save(out, overwrite=overwrite)
        return page

    # ---- persistence -----------------------------------------------------------------------
    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """Copy the run to ``path`` (a new directory, or an existing run of the same command with
        ``overwrite=True``); the result then lives there. Returns the path."""
        from poslens.rundir.outdir import prepare_out_dir

        from poslens.rundir.io import record_written

        dst = Path(path)
        _check_present(self.path)
        if dst.resolve() == self.path.resolve():
            return dst
        if dst.exists() and not overwrite:
            raise PoslensError(f"save({str(dst)!r}): it exists; choose a new directory or pass overwrite=True.")
        if dst.exists():
            _check_replaceable(dst, self.command)
        prepare_out_dir(dst, must_be_new=not overwrite)
        dst.parent.mkdir(parents=True, exist_ok=True)  # as --out: its parents are made (the stage lies beside it)
        from poslens.rundir.staging import stage_prefix, sweep_stale_stages

        sweep_stale_stages(dst, ("partial",))  # a killed save's scratch copy
        stage = Path(tempfile.mkdtemp(prefix=stage_prefix(dst, "partial"), dir=dst.parent))
        aside = None
        try:
            names = [f.name for f in sorted(self.path.iterdir())
                     if f.is_file() and f.name not in _NOT_RESULTS and not f.name.startswith(".")]
            for name in names:
                shutil.copy2(self.path / name, stage / name)
            record_written(stage, *names)
            if dst.exists():  # the previous run goes aside, and is deleted only once the copy is in place
                aside = Path(tempfile.mkdtemp(prefix=stage_prefix(dst, "previous"), dir=dst.parent))
                os.replace(dst, aside / "run")
            os.replace(stage, dst)
        except BaseException:
            if aside is not None and (aside / "run").exists() and not dst.exists():
                os.replace(aside / "run", dst)
            shutil.rmtree(stage, ignore_errors=True)
            raise
        finally:
            if aside is not None:
                shutil.rmtree(aside, ignore_errors=True)
        maps, tmp = self._maps, self._tmp
        self.__init__(dst)
        self._maps = maps
        if tmp is not None:  # the result now lives at dst: its temporary copy goes
            tmp.cleanup()
        return dst


def _check_replaceable(dst: Path, command: str) -> None:
    from poslens.rundir.load import classify
    from poslens.rundir.staging import foreign_files
    from poslens.rundir.io import read_json

    if classify(dst) != "command":
        raise PoslensError(f"save({str(dst)!r}): it exists and is not a poslens run; choose a new directory.")
    other = (read_json(dst / "config.json") or {}).get("command")
    if other != command:
        raise PoslensError(f"save({str(dst)!r}): it holds a {other} run, not a {command} run; choose a new directory.")
    foreign = foreign_files(dst)
    if foreign:
        raise PoslensError(f"save({str(dst)!r}): it also holds {foreign[0].relative_to(dst)}, which poslens did not "
                           "write (or the run has no record of its files); overwrite=True would delete it. Move it "
                           "away, or choose a new directory.")


def _check_present(path: Path) -> None:
    """A result whose run directory was removed (or moved) after the run is one error, not empty maps."""
    if not path.is_dir():
        raise PoslensError(f"the run directory {path} no longer exists (removed or moved after the run); run again, "
                           "or load the run from where it is now with poslens.load(path).")


def _read_maps(path: Path) -> dict:
    from poslens.rundir.io import read_tensors

    out: dict = {}
    files = sorted(p for p in path.glob("*.safetensors") if p.name not in _NOT_RESULTS)
    seen: dict[str, int] = {}
    per_file = []
    for f in files:
        t = read_tensors(f)
        per_file.append((f.stem, t))
        for k in t:
            seen[k] = seen.get(k, 0) + 1
    for stem, t in per_file:
        for k, v in t.items():
            out[k if seen[k] == 1 else f"{stem}.{k}"] = v
    return out


def _heads_from_maps(maps: dict) -> int:
    for k in ("sink_heads", "slash", "dim_logit", "q_gram"):
        if k in maps:
            return int(maps[k].shape[1])
    return 0


def _head_sink(maps: dict):
    """``[L, H]``: mean over queries 1 … S−1 of each head's weight on key 0 (from ``sink_heads`` ``[L, H, S]``)."""
    s = maps.get("sink_heads")
    if s is None or s.shape[-1] < 2:
        return None
    return s[..., 1:].double().mean(-1)


def _layer_convention(summary: dict) -> str:
    info = summary.get("layer_info") if isinstance(summary.get("layer_info"), dict) else {}
    return str(info.get("convention") or summary.get("layer_convention") or "decoder layers count from 0")


def _index_of(layer, ids: list, name: str) -> int:
    if layer in ids:
        return ids.index(layer)
    raise PoslensError(f"plot({name!r}, layer={layer!r}): the run has layers {ids[0]} … {ids[-1]} "
                       "(decoder layers count from 0).")


#: the columns of :meth:`CompareResult.changes`, in order, with what each holds
CHANGE_COLUMNS = {
    "reading": "sink, slash, prev_token, entropy, distance (per head, and per layer as the mean over heads); "
               "relativity, locality, diagonal_trend, band_high/medium/low, massive_dims (per layer); loss",
    "seq_len": "tokens per sequence of this row",
    "beyond_context": "seq_len is past the reference model's trained context",
    "layer": "decoder layer, counted from 0 (None for the loss)",
    "head": "query head (None: the layer's row)",
    "positions": "the loss row's positions [first, last] (None for other readings)",
    "a": "the reading of side A (mean over sequence groups)",
    "b": "the reading of side B on the same sequences",
    "delta": "b − a, the mean of the per-group differences",
    "se": "standard error of delta over the sequence groups",
    "p": "two-sided sign-flip p-value of delta = 0 over the groups",
    "floor": "z·se: the largest |delta| sampling noise alone reaches at the level",
    "threshold": "the smallest |delta| called a change (CHANGE_THRESHOLDS)",
    "significant": "p below the level after Benjamini–Hochberg over the reading's cells at this length",
    "verdict": "changed (significant and |delta| − floor ≥ threshold) or unchanged",
    "offset_a": "slash: side A's best offset Δ (where both sides' SlashScores are read)",
    "offset_b": "slash: side B's own best offset Δ",
}


class CompareResult(Result):
    """A finished comparison (``poslens compare``): :meth:`changes` is the table of every paired change,
    ``maps`` the per-group readings of both sides (``{a|b}.{S}.{reading}``), :meth:`plot` its figures."""

    def changes(self, reading: str | None = None, seq_len: int | None = None):
        """One row per reading, length, layer and head (the columns below); ``reading`` / ``seq_len``
        keep only those rows. ``attrs["layer_convention"]``: decoder layers count from 0.

{columns}
        """
        import pandas as pd

        beyond = self.summary.get("beyond_context") or {}
        rows = []
        for r in self.summary.get("changes") or []:
            if not isinstance(r, dict) or (reading is not None and r.get("reading") != reading) or \
                    (seq_len is not None and r.get("seq_len") != seq_len):
                continue
            rows.append({**{k: r.get(k) for k in CHANGE_COLUMNS}, "beyond_context": bool(beyond.get(str(r.get("seq_len"))))})
        if reading is not None and not rows and reading not in {r.get("reading") for r in self.summary.get("changes") or []}:
            raise PoslensError(f"changes(reading={reading!r}): this comparison has no such reading; it has "
                               f"{', '.join(sorted({str(r.get('reading')) for r in self.summary.get('changes') or []}))}.")
        df = pd.DataFrame(rows, columns=list(CHANGE_COLUMNS))
        for c in ("layer", "head", "offset_a", "offset_b"):
            df[c] = df[c].astype("Int64")
        df.attrs["layer_convention"] = _layer_convention(self.summary)
        return df

    changes.__doc__ = changes.__doc__.format(columns=_columns_doc(CHANGE_COLUMNS))

    def plot(self, name: str = "change", reading: str = "sink", *, seq_len: int | None = None, ax=None):
        """A matplotlib Figure: ``"change"`` the layers × heads map of B − A for ``reading`` (diverging, centred
        on 0, unchanged cells grey), ``"layers"`` the reading by layer for A and B with the noise floor,
        ``"lengths"`` the reading against length, ``"loss"`` the loss by position for both sides."""
        from poslens.analysis.compare.figures import compare_plot

        return compare_plot(self, name, reading, seq_len=seq_len, ax=ax)


def load(path: str | os.PathLike) -> Result:
    """Read a run directory back (written by the CLI or by :meth:`Result.save`); a comparison comes back as a
    :class:`CompareResult`."""
    from poslens.rundir.load import load_run

    try:
        command = load_run(Path(path)).command
    except PoslensError:
        command = None  # Result says what is wrong with it
    return CompareResult(path) if command == "compare" else Result(path)
