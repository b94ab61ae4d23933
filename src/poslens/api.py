"""poslens from Python: functions that take a model (loaded, or a path), return a :class:`Result`.

Every command of the CLI is a thin layer over the same library function; here each is a function
that returns the run as an object instead of printing it::

    import poslens
    r = poslens.scan(model, data="stdlib", seq_len=256, num_seqs=64)
    r.maps["probs"]          # torch tensors, the names and shapes of maps.safetensors
    r.summary                # dict, the content of summary.json
    r.heads(); r.layers()    # pandas DataFrames
    r.plot("scores", layer=3)
    r.save("runs/x"); poslens.load("runs/x")

A result not given ``out=`` lives in a temporary directory that is removed when the result is
garbage-collected (or the interpreter exits); :meth:`Result.save` copies it to a lasting place.
A CLI run directory and a saved result are the same thing: :func:`load` reads either.

Nothing here changes the process beyond the call: torch's thread count (``threads=``) is set for
the call and restored after it, and a model passed in is handed back as it was
(:mod:`poslens.capture.model.borrow`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import shutil
import tempfile
import textwrap
import weakref
from pathlib import Path
from typing import Any, Iterable, Iterator

from poslens.capture.scan.options import ScanConfig, scan_options
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
                        cells = ", ".join(f"{int(r.layer)}.{int(r.head)}: {getattr(r, col):.3g}"
                                          + (f" at Δ = {int(r.slash_offset)}" if col == "slash_score" else "")
                                          for r in t.itertuples())
                        parts.append(f"<tr><th style='text-align:left'>{label}</th><td style='text-align:left'>"
                                     f"{html.escape(cells)} (layer.head)</td></tr>")
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
        from poslens.reporting.readings import SLASH_MAX_DELTA

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
        for li, layer in enumerate(layer_ids):
            for h in range(H):
                row = {"layer": layer, "head": h, "sink": float("nan"), "slash_offset": None,
                       "slash_score": float("nan")}
                if sink is not None:
                    row["sink"] = float(sink[li, h])
                if slash is not None and slash.shape[-1] > 1:
                    window = slash[li, h, 1: min(SLASH_MAX_DELTA, slash.shape[-1] - 1) + 1].double()
                    if bool(window.isfinite().any()):
                        d = int(window.nan_to_num(-1.0).argmax()) + 1
                        row["slash_offset"], row["slash_score"] = d, float(window[d - 1])
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

    def tables(self) -> dict:
        """The summary's tables as DataFrames, by name."""
        import pandas as pd

        return {t.get("name") or f"table{i}": pd.DataFrame(t["rows"], columns=t["columns"])
                for i, t in enumerate(self._run.tables)}

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
        fig, ax = (ax.figure, ax) if ax is not None else notebook_figure(figsize=(5.2, 4.2))
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
        stage = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent if dst.parent.exists() else None))
        aside = None
        try:
            names = [f.name for f in sorted(self.path.iterdir())
                     if f.is_file() and f.name not in _NOT_RESULTS and not f.name.startswith(".")]
            for name in names:
                shutil.copy2(self.path / name, stage / name)
            record_written(stage, *names)
            if dst.exists():  # the previous run goes aside, and is deleted only once the copy is in place
                aside = Path(tempfile.mkdtemp(prefix=f".{dst.name}.previous-", dir=dst.parent))
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


def load(path: str | os.PathLike) -> Result:
    """Read a run directory back (written by the CLI or by :meth:`Result.save`)."""
    return Result(path)


# --------------------------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _run_dir(out, *, overwrite: bool = False, resume: bool = False) -> Iterator[tuple[Path, Any]]:
    """``(directory to write, TemporaryDirectory or None)``: ``out``, or a fresh temporary directory that is
    removed again if the run fails."""
    if out is not None:
        out = Path(out)
        if out.exists() and overwrite and not resume:
            from poslens.rundir.outdir import prepare_out_dir

            prepare_out_dir(out, must_be_new=False)
        yield out, None
        return
    tmp = tempfile.TemporaryDirectory(prefix="poslens-")
    try:
        yield Path(tmp.name) / "run", tmp
    except BaseException:
        tmp.cleanup()
        raise


def _finish(path: Path, tmp) -> Result:
    r = Result(path, _tmp=tmp)
    if tmp is not None:
        weakref.finalize(r, tmp.cleanup)
    return r


@contextlib.contextmanager
def _threads(n):
    """torch's CPU threads for one call, restored after it: ``"auto"`` the CLI's policy (the CPUs not
    busy with other processes, :func:`poslens.runtime.default_threads`), an int that count, None
    unchanged."""
    from poslens.runtime import set_threads

    if n is None:
        yield
        return
    if n != "auto" and (isinstance(n, bool) or not isinstance(n, int)):
        raise PoslensError(f"threads={n!r}: pass 'auto', a positive count, or None (leave torch's setting).")
    with set_threads(None if n == "auto" else n):
        yield


def _model_arg(model) -> tuple[str, Any]:
    """``(model_dir string, loaded model or None)``."""
    if isinstance(model, (str, os.PathLike)):
        return str(model), None
    if isinstance(model, Result):
        raise PoslensError("model: a Result is not a model; pass a loaded causal LM or a model path.")
    from poslens.capture.model.borrow import check_causal_lm

    check_causal_lm(model)
    return f"<in-memory {type(model).__name__}: {getattr(model, 'name_or_path', '') or 'unnamed'}>", model


def _scan_keywords(fn):
    """``fn`` with the options of a scan as keywords: ``fn(model, *, <its own keywords>, **options)``
    gets every option of :class:`~poslens.capture.scan.options.ScanConfig` that Python passes. Its
    signature lists them (default and annotation, for ``help()`` and notebooks) and its docstring says
    what each means; a call binds to that signature, so an unknown keyword is a TypeError."""
    own = list(inspect.signature(fn, eval_str=True).parameters.values())
    options = [o for o in scan_options() if o.python]
    P = inspect.Parameter

    def param(o, kind):
        return P(o.name, kind, default=o.python_default, annotation=o.python_type)

    params = [p for p in own if p.kind == P.POSITIONAL_OR_KEYWORD] + \
        [param(o, P.POSITIONAL_OR_KEYWORD) for o in options if o.python == "positional"] + \
        [p for p in own if p.kind == P.KEYWORD_ONLY] + \
        [param(o, P.KEYWORD_ONLY) for o in options if o.python == "keyword"]
    sig = inspect.Signature(params, return_annotation=inspect.signature(fn, eval_str=True).return_annotation)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return fn(**bound.arguments)

    call.__signature__ = sig
    call.__annotations__ = {p.name: p.annotation for p in params}
    call.__doc__ = inspect.cleandoc(fn.__doc__ or "") + "\n\n" + _options_doc(options)
    return call


def _options_doc(options) -> str:
    """The docstring section of the scan options: ``name: type = default`` and what it means."""
    lines = ["Scan options (each also a flag of ``poslens scan``, ``seq_len`` as ``--seq-len``):", ""]
    for o in options:
        lines.append(f"{o.name}: {inspect.formatannotation(o.python_type)} = {o.python_default!r}")
        lines += textwrap.wrap(o.help, 96, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(lines)


@_scan_keywords
def scan(model, *, tokenizer=None, progress: bool = True, threads: int | str | None = "auto", **options) -> Result:
    """Scan a causal LM for positional structure (the library behind ``poslens scan``); returns a :class:`Result`.

    ``model``: a loaded ``transformers`` causal LM (any dtype, on CPU or GPU, or placed with a
    ``device_map``: scanned where it is, never copied, handed back unchanged), or the path of a model
    directory or ``.gguf`` file (loaded as the CLI loads it; ``dtype``/``device``/``device_map`` apply).

    ``data``: ``"stdlib"`` (default), ``"random"``, a ``.jsonl``/``.txt`` path or datasets directory (as
    ``--data``), a list of strings (tokenised with ``tokenizer`` or the model's own), a list of token-id
    lists or an ``[N, S]`` integer tensor. ``seq_len`` defaults to the data's row length for token ids and
    to 256 otherwise; ``num_seqs`` to every sequence of in-memory data and to 64 otherwise.

    The other options are those of ``poslens scan`` (listed below), its list-valued ones also as
    Python lists (``stats=["scores", "probs"]``, ``layers=[0, 5]``, ``heads=[(3, 5)]``). ``out``: a run
    directory to write (default: a temporary one; see :meth:`Result.save`). ``figures`` defaults to
    False (:meth:`Result.plot` draws on demand). ``progress``: a progress bar. ``threads``: torch's CPU
    threads for this call, restored after it: ``"auto"`` (default) the CLI's policy (the CPUs not busy
    with other processes), a count, or None (torch's current setting).
    """
    from poslens.capture.scan.run import run_scan
    from poslens.data.sources import is_python_data, python_source

    _check_keywords(options)
    model_dir, loaded = _model_arg(model)
    data, out = options["data"], options["out"]
    source = None
    if not is_python_data(data):
        tokenizer = _text_tokenizer(loaded, data, tokenizer)
    if is_python_data(data):
        if tokenizer is None and _has_strings(data):
            tokenizer = _tokenizer_for(model_dir, loaded, options["trust_remote_code"])
        vocab = _vocab_size(model_dir, loaded, options["allow_pickle"], options["trust_remote_code"])
        source, label = python_source(data, seq_len=options["seq_len"], num_seqs=options["num_seqs"],
                                      tokenizer=tokenizer, vocab_size=vocab)
        options.update(data=label, seq_len=source.seq_len, num_seqs=source.num_seqs)
    else:
        options["data"] = str(data)
        for name in ("seq_len", "num_seqs"):  # None: the CLI's default
            if options[name] is None:
                options[name] = getattr(ScanConfig, name)
    with _run_dir(out, overwrite=options["overwrite"], resume=options["resume"]) as (path, tmp):
        options.update(out=path, overwrite=options["overwrite"] and out is not None)
        cfg = ScanConfig(model_dir=model_dir, **{o.name: o.from_keyword(options[o.name])
                                                  for o in scan_options() if o.python})
        with _threads(threads):
            summary = run_scan(cfg, progress=progress, model=loaded, tokenizer=tokenizer, source=source)
        if "layers" not in summary:  # a rank other than 0 of a distributed scan: rank 0 wrote the run
            return None  # type: ignore[return-value]
        return _finish(path, tmp)


def _text_tokenizer(loaded, data, tokenizer):
    """The tokenizer a loaded model's named text data (``"stdlib"``, a text file) needs: ``tokenizer``, else
    the one saved beside the model; none found is an error in Python's words (``tokenizer=``)."""
    if tokenizer is not None or loaded is None or str(data) == "random" or str(data).endswith(".jsonl"):
        return tokenizer
    from poslens.capture.scan.plan import loaded_model_tokenizer

    found = loaded_model_tokenizer(loaded)
    if found is None:
        raise PoslensError(f"data={str(data)!r} is text, and no tokenizer is saved beside this model (a model loaded "
                           "from a GGUF file or built in memory has none there); pass tokenizer= (e.g. "
                           "AutoTokenizer.from_pretrained(...)), or data='random' or token ids.")
    return found


def _check_keywords(options: dict) -> None:
    """A scan keyword of the wrong type (``seq_len='32'``, ``seq_len=16.5``, ``data=None``), refused in
    one line naming the keyword, before anything is made."""
    import types
    import typing

    if options.get("data") is None:
        raise PoslensError("data=None: pass 'stdlib' (the default), 'random', a .jsonl/.txt path, a list of "
                           "strings or token-id lists, or an [N, S] integer tensor.")
    for o in scan_options():
        v = options.get(o.name)
        if not o.python or v is None:
            continue
        t = o.type
        kinds = set(typing.get_args(t)) - {type(None)} if typing.get_origin(t) in (typing.Union, types.UnionType) \
            else {t}
        if kinds == {int} and (isinstance(v, bool) or not isinstance(v, int)):
            raise PoslensError(f"{o.name}={v!r}: pass an integer.")
        if kinds == {float} and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise PoslensError(f"{o.name}={v!r}: pass a number.")
        if kinds == {bool} and not isinstance(v, bool):
            raise PoslensError(f"{o.name}={v!r}: pass True or False.")


def _has_strings(data) -> bool:
    return isinstance(data, (list, tuple)) and any(isinstance(x, str) for x in data)


def _tokenizer_for(model_dir: str, loaded, trust_remote_code: bool):
    from poslens.capture.model.load import load_tokenizer
    from poslens.capture.scan.plan import loaded_model_tokenizer

    return loaded_model_tokenizer(loaded) if loaded is not None else load_tokenizer(model_dir, trust_remote_code)


def _vocab_size(model_dir: str, loaded, allow_pickle: bool, trust_remote_code: bool):
    if loaded is not None:
        return getattr(loaded.config, "vocab_size", None)
    from poslens.capture.model.load import open_model_config

    config, _ = open_model_config(model_dir, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    return getattr(config, "vocab_size", None)


def simulate(*, alpha: float = 0.0, num_layers: int = 4, seq_len: int = 50, dim: int = 64, samples: int = 100_000,
             norm: str = "l2", scale: str | None = None, rope: bool = False, rope_theta: float = 10000.0,
             causal: bool = True, seed: int = 0, device: str = "auto", chunk_size: int = 0,
             target_stderr: float | None = None, out: str | os.PathLike | None = None, overwrite: bool = False,
             figures: bool = False, progress: bool = True, threads: int | str | None = "auto") -> Result:
    """The parameter-free transformer of arXiv 2509.21042 (``poslens simulate``); returns a :class:`Result`
    whose ``maps`` are ``scores``, ``scores_stderr`` and ``probs`` ``[L, S, S]``."""
    from poslens.progress import task_progress
    from poslens.runtime import parse_device
    from poslens.simulator import SimConfig, run_simulation, save_result

    cfg = SimConfig(alpha=alpha, layers=num_layers, seq_len=seq_len, dim=dim, samples=samples, norm=norm,
                    scale=scale, rope=rope, rope_theta=rope_theta, causal=causal, seed=seed,
                    device=parse_device(device), chunk_size=chunk_size, target_stderr=target_stderr).validate()
    if out is not None and Path(out).exists() and not overwrite:
        raise PoslensError(f"out={str(out)!r} exists; choose a new directory or pass overwrite=True.")
    with _run_dir(out, overwrite=overwrite) as (path, tmp):
        with _threads(threads), task_progress(f"simulate ({cfg.label()})", cfg.samples, enabled=progress) as update:
            res = run_simulation(cfg, progress=lambda done, total: update(done, total),
                                 workers=threads if isinstance(threads, int) else None)
        save_result(res, path, figures=figures)
        return _finish(path, tmp)


def slash(scan: Result | str | os.PathLike, *, random_scan: Result | str | os.PathLike | None = None,
          kappa: Iterable[float] = (0.1, 0.2, 0.3, 0.5, 0.7, 0.9), persist_kappa: float | None = None,
          min_delta: int = 1, max_delta: int = 16, model_dir: str | None = None, top: int = 20,
          out: str | os.PathLike | None = None, overwrite: bool = False, figures: bool = False) -> Result:
    """Slash-dominant heads (arXiv 2601.08297, ``poslens slash``) of a finished scan (a :class:`Result`
    or its directory); ``random_scan``: the same model scanned on ``data="random"`` (persistence test)."""
    from poslens.analysis.slash import SlashConfig, run_slash

    scan_dir, random_dir = _run_path(scan, "scan"), _run_path(random_scan, "random_scan") if random_scan else None
    if model_dir is None and isinstance(scan, Result):
        model_dir = _model_dir_of(scan)
    with _run_dir(out, overwrite=overwrite) as (path, tmp):
        run_slash(SlashConfig(scan_dir=str(scan_dir), out=str(path), random_scan=str(random_dir) if random_dir else None,
                              kappa=tuple(kappa), persist_kappa=persist_kappa, min_delta=min_delta,
                              max_delta=max_delta, model_dir=model_dir, top=top, figures=figures))
        return _finish(path, tmp)


def neighborhood(model, *, tokenizer=None, data: str = "random", seq_len: int = 64, num_seqs: int = 32,
                 batch_size: int = 8,
                 seed: int = 0, chars: str | None = None, bidirectional: bool = False, device: str = "auto",
                 out: str | os.PathLike | None = None, overwrite: bool = False, figures: bool = False,
                 progress: bool = True, threads: int | str | None = "auto", allow_pickle: bool = False,
                 trust_remote_code: bool = False) -> Result:
    """Self-cosine maps, APS and norm score per layer (arXiv 2501.00073, ``poslens neighborhood``) of a
    model: a loaded causal LM (handed back unchanged) or a model path; ``tokenizer``: a loaded model's text
    tokenizer (default: the one saved beside it)."""
    from poslens.analysis.neighborhood import NeighborhoodConfig, run_neighborhood

    model_dir, loaded = _model_arg(model)
    tokenizer = _text_tokenizer(loaded, data, tokenizer) if chars is None else tokenizer
    with _run_dir(out, overwrite=overwrite) as (path, tmp):
        cfg = NeighborhoodConfig(model_dir=model_dir, out=str(path), data=data, seq_len=seq_len, num_seqs=num_seqs,
                                 batch_size=batch_size, seed=seed, bidirectional=bidirectional, chars=chars,
                                 device=device, figures=figures, overwrite=overwrite and out is not None,
                                 allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
        with _threads(threads):
            run_neighborhood(cfg, progress=progress, model=loaded, tokenizer=tokenizer)
        return _finish(path, tmp)


def _run_path(run, what: str) -> Path:
    if isinstance(run, Result):
        return run.path
    if isinstance(run, (str, os.PathLike)):
        return Path(run)
    raise PoslensError(f"{what}: expected a poslens Result or a run directory; got {type(run).__name__}.")


def _model_dir_of(result: Result) -> str | None:
    md = (result.config.get("options") or {}).get("model_dir")
    if isinstance(md, str) and not md.startswith("<in-memory"):
        return md
    src = result.config.get("model_source") or {}
    name = src.get("name_or_path")
    return name if name and Path(name).exists() else None


def panels(model, *, tokenizer=None, layer: int = 0, data: str = "stdlib", num_seqs: int = 200, seq_len: int = 50,
           batch_size: int = 10, seed: int = 0, device: str = "auto", dtype: str = "fp32",
           out: str | os.PathLike | None = None, overwrite: bool = False, figures: bool = False,
           progress: bool = True, threads: int | str | None = "auto", allow_pickle: bool = False,
           trust_remote_code: bool = False) -> Result:
    """The nine-panel Gram decomposition of one decoder layer (arXiv 2509.21042, ``poslens panels``) of a
    loaded causal LM (handed back unchanged) or a model path; ``maps["panels"]`` is ``[9, S, S]``.
    ``tokenizer``: a loaded model's text tokenizer (default: the one saved beside it)."""
    from poslens.analysis.panels import PanelsConfig, run_panels

    model_dir, loaded = _model_arg(model)
    tokenizer = _text_tokenizer(loaded, data, tokenizer)
    if out is not None and Path(out).exists() and not overwrite:
        raise PoslensError(f"out={str(out)!r} exists; choose a new directory or pass overwrite=True.")
    with _run_dir(out, overwrite=overwrite) as (path, tmp):
        cfg = PanelsConfig(model_dir=model_dir, out=str(path), layer=layer, data=data, num_seqs=num_seqs,
                           seq_len=seq_len, batch_size=batch_size, seed=seed, device=device, dtype=dtype,
                           allow_pickle=allow_pickle, trust_remote_code=trust_remote_code, figures=figures)
        with _threads(threads):
            run_panels(cfg, progress=progress, model=loaded, tokenizer=tokenizer)
        return _finish(path, tmp)


def kim_maps(scan: Result | str | os.PathLike, *, out: str | os.PathLike | None = None, overwrite: bool = False,
             figures: bool = False) -> Result:
    """Raw and diagonal-normalised score maps of every layer of a finished scan, with non-relativity
    per layer (arXiv 2509.21042, ``poslens kim-maps``)."""
    from poslens.analysis.panels import run_score_maps

    scan_dir = _run_path(scan, "scan")
    with _run_dir(out, overwrite=overwrite) as (path, tmp):
        run_score_maps(str(scan_dir), str(path), figures=figures)
        return _finish(path, tmp)


def probes(models: Iterable[str | os.PathLike], *, out: str | os.PathLike | None = None, overwrite: bool = False,
           progress: bool = True, threads: int | str | None = "auto", **options) -> Result:
    """Position probes per layer (arXiv 2501.00073, ``poslens probes``) of model directories; ``options``
    are the fields of :class:`poslens.analysis.probes.ProbesConfig` (``seq_len``, ``train_chars``, ...)."""
    from poslens.analysis.probes import ProbesConfig, run_probes

    dirs = [str(_run_path(m, "models")) for m in ([models] if isinstance(models, (str, os.PathLike)) else models)]
    with _run_dir(out, overwrite=overwrite) as (path, tmp):
        cfg = _config(ProbesConfig, model_dirs=dirs, out=str(path), **options)
        with _threads(threads):
            run_probes(cfg, progress=progress)
        return _finish(path, tmp)


def sweep(*, out: str | os.PathLike | None = None, overwrite: bool = False, progress: bool = True,
          threads: int | str | None = "auto", **options) -> Result:
    """APS of random-init NoPE models over the initialisation scale σ (arXiv 2501.00073, ``poslens
    sweep``); ``options`` are the fields of :class:`poslens.analysis.sweep.SweepConfig`."""
    from poslens.analysis.sweep import SweepConfig, run_sweep

    with _run_dir(out, overwrite=overwrite) as (path, tmp):
        cfg = _config(SweepConfig, out=str(path), **{"figures": False, **options})
        with _threads(threads):
            run_sweep(cfg, progress=progress)
        return _finish(path, tmp)


def report(runs: Iterable[Result | str | os.PathLike] | Result | str | os.PathLike, path: str | os.PathLike,
           *, title: str = "poslens report") -> Path:
    """One self-contained HTML report over results or run directories (``poslens report``); returns its path."""
    from poslens.reporting import write_report

    runs = [runs] if isinstance(runs, (Result, str, os.PathLike)) else list(runs)
    return write_report([_run_path(r, "runs") for r in runs], path, title=title)


def _config(cls, **fields):
    """``cls(**fields)``, an unknown field named as a :class:`PoslensError`."""
    import dataclasses

    known = {f.name for f in dataclasses.fields(cls)}
    bad = sorted(set(fields) - known)
    if bad:
        raise PoslensError(f"unknown option(s) {', '.join(bad)}; {cls.__name__} takes {', '.join(sorted(known))}.")
    return cls(**fields)


def fingerprint(models, *, tokenizer=None, data: str = "stdlib", seq_len: int | None = None,
                num_seqs: int | None = None,
                batch_size: int = 4, seed: int = 0, device: str = "auto", dtype: str = "auto",
                eps: float | None = None, kappa: float | None = None, massive_lambda: float | None = None,
                out: str | os.PathLike | None = None, overwrite: bool = False, figures: bool = False,
                progress: bool = True, threads: int | str | None = "auto", allow_pickle: bool = False,
                trust_remote_code: bool = False) -> Result:
    """The positional fingerprint of one or more models side by side (``poslens fingerprint``): each model
    (a loaded causal LM, handed back unchanged, or a model directory / ``.gguf`` path) is scanned on text
    and on random tokens of the same shape; the traits (sinks, slash heads, relativity, APS, RoPE frequency
    use, massive Q/K dimensions) per layer and per model. Returns a :class:`Result`: ``summary`` and
    ``tables()``, ``maps`` (``<model>.sink`` ``[L, H]``, ...), :meth:`Result.traits` (the per-layer or
    per-model DataFrame), and ``path / "fingerprint.html"`` once saved with figures.

    ``tokenizer``: the text tokenizer of a loaded model (one for every loaded model, or a list beside
    ``models``); without it, the tokenizer saved beside the model (a loaded GGUF model has none: pass it)."""
    from poslens.analysis import fingerprint as F

    items = [models] if isinstance(models, (str, os.PathLike)) or not isinstance(models, (list, tuple)) else models
    toks = list(tokenizer) if isinstance(tokenizer, (list, tuple)) else [tokenizer] * len(items)
    if len(toks) != len(items):
        raise PoslensError(f"tokenizer=: {len(toks)} tokenizers for {len(items)} models; pass one, or one per model.")
    labels, loaded, tokenizers = [], {}, {}
    for m, tok in zip(items, toks):
        label, obj = _model_arg(m)
        if obj is not None:
            label = f"{label[:-1]} #{len(loaded) + 1}>" if label in loaded else label
            loaded[label] = obj
            tokenizers[label] = _text_tokenizer(obj, data, tok)
        labels.append(label)
    opts = {k: v for k, v in dict(seq_len=seq_len, num_seqs=num_seqs, eps=eps, kappa=kappa,
                                   massive_lambda=massive_lambda).items() if v is not None}
    if out is not None and Path(out).exists() and not overwrite:
        raise PoslensError(f"out={str(out)!r} exists; choose a new directory or pass overwrite=True.")
    with _run_dir(out, overwrite=False) as (path, tmp):
        cfg = F.FingerprintConfig(models=labels, out=str(path), data=str(data), batch_size=batch_size, seed=seed,
                                  device=device, dtype=dtype, figures=figures, overwrite=overwrite,
                                  allow_pickle=allow_pickle, trust_remote_code=trust_remote_code, **opts)
        with _threads(threads):
            F.run_fingerprint(cfg, progress=progress, loaded=loaded, tokenizers=tokenizers)
        return _finish(path, tmp)


def ablate(model, interventions="rope-off", *, layers="each", tokenizer=None, data="stdlib",
           seq_len: int | None = None, num_seqs: int | None = None, batch_size: int = 4, seed: int = 0,
           noise_groups: int = 8, massive_lambda: float = 5.0, readings: bool = False, probes: bool = False,
           device: str = "auto", dtype: str = "auto", out: str | os.PathLike | None = None, overwrite: bool = False,
           figures: bool = False,
           progress: bool = True, threads: int | str | None = "auto", allow_pickle: bool = False,
           trust_remote_code: bool = False) -> Result:
    """Switch sources of position off and measure what the model loses (``poslens ablate``); returns a
    :class:`Result`.

    ``model``: a loaded causal LM (handed back unchanged: its logits afterwards equal those before) or a
    model directory / ``.gguf`` path. ``interventions``: one name or a list of ``rope-off``,
    ``rope-band:high|medium|low``, ``massive-qk``, ``random-qk`` (its control), ``sink-off``, ``window:W``
    (:mod:`poslens.capture.engine.intervene`). ``layers``: ``"each"`` (one decoder layer at a time, from 0),
    ``"all"``, a list of layers ablated together (``[0, 3]`` or ``"0,3,5-7"``), or ``"each:0-5"``.
    ``data``, ``tokenizer``, ``seq_len`` (default 256), ``num_seqs`` (default 32): as :func:`scan`.
    ``noise_groups``: sequence groups for the standard errors (sequence n in group n % G). ``readings``:
    also scan the same sequences under every condition (scores, probs, slash; kept under ``scans/``) for
    the relativity index, sink weight and slash heads under the intervention. ``probes``: also fit a linear
    position probe on every layer's residual stream under every condition (tested on held-out sequences).

    The result's ``summary["conditions"]`` holds, per condition, the paired change of the mean
    next-token loss (``delta``: mean, se, p) overall and per position bucket; ``summary["findings"]``
    says it in words; ``tables()["conditions"]`` is the table; ``layers()`` the per-layer changes of a
    layer-at-a-time ablation; ``maps`` the per-token losses (``loss_base`` and ``loss.<condition>``,
    ``[N, S - 1]``)."""
    from poslens.analysis.ablate.config import AblateConfig
    from poslens.analysis.ablate.run import run_ablate

    model_dir, loaded = _model_arg(model)
    ivs = [interventions] if isinstance(interventions, str) else list(interventions or [])
    py_data = None
    from poslens.data.sources import is_python_data

    if is_python_data(data):
        py_data, data = data, "python"
    for name, v in (("seq_len", seq_len), ("num_seqs", num_seqs), ("batch_size", batch_size),
                    ("noise_groups", noise_groups), ("seed", seed)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise PoslensError(f"{name}={v!r}: pass an integer.")
    if out is not None and Path(out).exists() and not overwrite:
        raise PoslensError(f"out={str(out)!r} exists; choose a new directory or pass overwrite=True.")
    with _run_dir(out, overwrite=overwrite) as (path, tmp):
        cfg = AblateConfig(model_dir=model_dir, out=str(path), interventions=ivs, layers=layers, data=str(data),
                           seq_len=seq_len, num_seqs=num_seqs, batch_size=batch_size,
                           seed=seed, noise_groups=noise_groups, massive_lambda=massive_lambda, readings=readings,
                           probes=probes, device=device, dtype=dtype, figures=figures, overwrite=overwrite and out is not None,
                           allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
        with _threads(threads):
            run_ablate(cfg, progress=progress, model=loaded, tokenizer=tokenizer, data=py_data)
        return _finish(path, tmp)
