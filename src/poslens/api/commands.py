"""The functions behind the CLI, one per command: each takes a model (loaded, or a path) and
returns a :class:`poslens.api.result.Result`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from poslens.capture.scan.options import ScanConfig, scan_options
from poslens.errors import PoslensError
from poslens.api.calls import (_check_keywords, _config, _finish, _model_arg, _model_dir_of, _run_dir, _run_path,
                               _scan_keywords, _text_tokenizer, _threads)
from poslens.api.result import Result


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
    from poslens.data.sources import is_python_data

    _check_keywords(options)
    model_dir, loaded = _model_arg(model)
    data, out = options["data"], options["out"]
    if is_python_data(data):  # packed when the scan is planned: its label, and its shape unless given
        options["data"] = "in-memory"
    else:
        data, options["data"] = None, str(data)
        for name in ("seq_len", "num_seqs"):  # None: the CLI's default
            if options[name] is None:
                options[name] = getattr(ScanConfig, name)
    with _run_dir(out) as (path, tmp):  # out (checked when the scan is planned), or a temporary one
        options.update(out=path, overwrite=options["overwrite"] and out is not None)
        cfg = ScanConfig(model_dir=model_dir, **{o.name: o.from_keyword(options[o.name])
                                                  for o in scan_options() if o.python})
        with _threads(threads):
            summary = run_scan(cfg, progress=progress, model=loaded, tokenizer=tokenizer, data=data)
        if "layers" not in summary:  # a rank other than 0 of a distributed scan: rank 0 wrote the run
            return None  # type: ignore[return-value]
        return _finish(path, tmp)


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


def explore(*runs, out: str | os.PathLike | None = None, overwrite: bool = False,
            title: str = "poslens explorer"):
    """An interactive page over scan and comparison runs (results or run directories; ``poslens explore``):
    a :class:`poslens.Explorer`, shown inline in Jupyter, written to ``out`` when given. Every run is read
    and checked before anything is written."""
    from poslens.api.result import load
    from poslens.explorer import build, check_out

    if out is not None:  # before any run is read
        check_out(Path(out), overwrite=overwrite)
    if len(runs) == 1 and isinstance(runs[0], (list, tuple)):
        runs = tuple(runs[0])
    if not runs:
        raise PoslensError("explore(): pass one or more run directories (or results) of poslens scan or poslens "
                           "compare.")
    results = [r if isinstance(r, Result) else load(_run_path(r, "explore()")) for r in runs]
    page = build(results, title=title)
    if out is not None:
        page.save(out, overwrite=overwrite)
    return page


def fingerprint(models, *, tokenizer=None, data: str = "stdlib", seq_len: int | None = None,
                num_seqs: int | None = None,
                batch_size: int = 4, seed: int = 0, device: str = "auto", dtype: str = "auto",
                eps: float | None = None, kappa: float | None = None, massive_lambda: float | None = None,
                out: str | os.PathLike | None = None, overwrite: bool = False, figures: bool = False,
                progress: bool = True, threads: int | str | None = "auto", allow_pickle: bool = False,
                trust_remote_code: bool = False, names: Iterable[str] | None = None) -> Result:
    """The positional fingerprint of one or more models side by side (``poslens fingerprint``): each model
    (a loaded causal LM, handed back unchanged, or a model directory / ``.gguf`` path) is scanned on text
    and on random tokens of the same shape; the traits (sinks, slash heads, relativity, APS, RoPE frequency
    use, massive Q/K dimensions) per layer and per model. Returns a :class:`Result`: ``summary`` and
    ``tables()``, ``maps`` (``<model>.sink`` ``[L, H]``, ...), :meth:`Result.traits` (the per-layer or
    per-model DataFrame), and ``path / "fingerprint.html"`` once saved with figures.

    ``tokenizer``: the text tokenizer of a loaded model (one for every loaded model, or a list beside
    ``models``); without it, the tokenizer saved beside the model (a loaded GGUF model has none: pass it).
    ``names``: one name per model (the keys ``<name>.sink`` of ``maps``, the rows of ``traits()``); default:
    a ``.gguf`` file's stem, a directory's name, a loaded model's ``name_or_path`` (a GGUF dequantised into
    poslens's cache is named after its file)."""
    from poslens.analysis import fingerprint as F
    from poslens.reporting.fingerprint import fingerprint_page

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
            F.run_fingerprint(cfg, progress=progress, loaded=loaded, tokenizers=tokenizers, page=fingerprint_page,
                              names=None if names is None else list(names))
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
    next-token loss (``delta``: mean, se, p) overall and per position bucket, and whether it is beyond the
    noise (``beyond_noise``); :func:`poslens.reporting.readings.ablate.ablate_readings` says it in words;
    ``tables()["conditions"]`` is the table; ``layers()`` the per-layer changes of a
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


def compare(a, b=None, *, variants=None, data="stdlib", data_b=None, tokenizer=None, seq_len=256,
            num_seqs: int = 16, batch_size: int = 4, seed: int = 0, noise_groups: int = 16, map_size: int = 256,
            beyond_context: bool = False, device: str = "auto", dtype: str = "auto",
            out: str | os.PathLike | None = None, overwrite: bool = False, figures: bool = False,
            progress: bool = True, threads: int | str | None = "auto", allow_pickle: bool = False,
            trust_remote_code: bool = False):
    """Compare two variants of a model on the same sequences (``poslens compare``); returns a
    :class:`poslens.api.result.CompareResult`.

    ``a``, ``b``: loaded causal LMs (handed back as they were) or model paths (directory or ``.gguf``);
    ``b`` None compares ``a`` with ``a`` under ``variants``: ``"rope-scaling=yarn:4"`` (linear, dynamic,
    yarn, llama3 through transformers' own RoPE code), ``"rope-theta=X"``, ``"dtype=bfloat16"``,
    ``"window=W"``, or an ablate intervention such as ``"rope-off@3"`` / ``"sink-off@all"``; each applied
    to the loaded model and undone afterwards. Two models must share a tokenizer and a layer × head grid.

    ``seq_len``: one length or several (``[512, 2048]`` or ``"512,2048"``): every variant at every length,
    on the same sequences cut to each; ``beyond_context=True`` allows lengths past the model's trained
    context. ``noise_groups``: sequence groups of the paired statistics (sequence n in group n % G).
    ``map_size``: score maps as block means on at most this many blocks per axis (0: full maps).
    ``data_b``: other sequences for side B, paired row by row with ``data`` (a null check: the same model
    on two samples).

    ``result.changes()`` is one row per reading, length, layer and head: ``a``, ``b``, ``delta`` (B − A),
    ``se``, ``p`` (sign-flip, Benjamini–Hochberg over each reading's cells) and ``verdict``
    (``changed`` / ``unchanged``, by the one verdict rule against ``z·se`` and the reading's threshold)."""
    from poslens.analysis.compare.config import CompareConfig
    from poslens.analysis.compare.run import run_compare
    from poslens.api.result import CompareResult
    from poslens.data.sources import is_python_data

    dir_a, loaded_a = _model_arg(a)
    dir_b, loaded_b = _model_arg(b) if b is not None else (None, None)
    if isinstance(variants, str):
        variants = [variants]
    for name, v in (("num_seqs", num_seqs), ("batch_size", batch_size), ("noise_groups", noise_groups),
                    ("seed", seed), ("map_size", map_size)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise PoslensError(f"{name}={v!r}: pass an integer.")
    py_data = None
    if is_python_data(data):
        py_data, data = data, "python"
    if out is not None and Path(out).exists() and not overwrite:
        raise PoslensError(f"out={str(out)!r} exists; choose a new directory or pass overwrite=True.")
    with _run_dir(out, overwrite=overwrite) as (path, tmp):
        cfg = CompareConfig(model_a=dir_a, model_b=dir_b, variants=list(variants or []), out=str(path), data=str(data),
                            seq_lens=seq_len, num_seqs=num_seqs, batch_size=batch_size, seed=seed,
                            noise_groups=noise_groups, map_size=map_size, beyond_context=bool(beyond_context),
                            device=device, dtype=dtype, figures=figures, overwrite=overwrite and out is not None,
                            allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
        with _threads(threads):
            run_compare(cfg, progress=progress, model_a=loaded_a, model_b=loaded_b, tokenizer=tokenizer, data=py_data,
                        data_b=data_b, python=True)
        return _finish(path, tmp, CompareResult)
