"""``poslens fingerprint``: the positional fingerprint of one or more models, side by side.

For every model (a Hugging Face directory or a ``.gguf`` file) :func:`fingerprint` runs two scans
of the same shape, one on text (the Python standard library's sources) and one on uniformly random
tokens, into ``OUT/scans/<model>/{text,random}``, and reads a fixed set of traits from them, per
layer and for the whole model (:func:`poslens.analysis.fingerprint_traits.model_traits`):

- **sink** (Gu et al., ICLR 2025): each head's mean weight on key 0 over queries 1 .. S-1; per layer
  the share of heads above eps = 0.3 (:mod:`poslens.metrics.fingerprint`), on text and on random tokens;
- **slash heads** (Cheng et al., arXiv 2601.08297): the (kappa, Δ)-slash-dominant heads with Δ in
  1 .. :data:`poslens.metrics.slash.SLASH_MAX_DELTA`, whether each persists on random tokens, its
  rank-one pre-RoPE q/k energy and the offset its RoPE frequencies predict
  (:func:`poslens.analysis.slash.analyze_scans`, the numbers of ``poslens slash``);
- **relativity** (Kim et al., arXiv 2509.21042): the scan's relativity index with the sink column
  left out and the noise floor applied (None where the layer's map is flat), and the signed trend;
- **APS ± sd** (Zuo et al., arXiv 2501.00073) per layer, and which layers rotate q/k;
- **RoPE frequency usage** (Barbero et al., ICLR 2025): each head's share of q·k energy per rotary
  pair from the pre-RoPE pair norms, summed into the high / medium / low bands of
  :func:`poslens.rope.frequency_bands` at the scanned length;
- **massive Q/K dimensions** (Jin et al., ICML 2025): dims whose RMS exceeds 5 x the layer's mean,
  and how many sit in low-frequency pairs.

Models whose layers differ in kind (Gemma 3's sliding-window and global layers, with their own RoPE
bases) get every trait per layer type as well. Each paper's claim is judged on every model
(:mod:`poslens.metrics.judge.fingerprint`: a verdict record of numbers and codes). ``OUT`` holds
``fingerprint.json`` (the summary), ``fingerprint.safetensors`` (per-head tensors) and, drawn by the page
passed in (:data:`Page`), ``fingerprint.html`` (models in columns, shared axes and colour scales) and the
figures.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from poslens.analysis.fingerprint_traits import RANDOM_STATS, SLASH_KAPPA, TEXT_STATS, model_traits
from poslens.capture.model.source import model_names
from poslens.errors import PoslensError, require_positive
from poslens.metrics.fingerprint import MASSIVE_LAMBDA, SINK_EPS
from poslens.conventions import SLASH_MAX_DELTA, SLASH_MIN_DELTA
from poslens.conventions import NOISE_P as VERDICT_LEVEL, VERDICT_THRESHOLDS as VERDICT_THRESHOLDS
from poslens.metrics.judge.fingerprint import judge_claims
from poslens.metrics.verdicts import RULE as VERDICT_RULE
from poslens.conventions import LAYER_CONVENTION
from poslens.rundir.summary import write_summary
from poslens.rundir.io import _atomic_write_bytes, versions, write_json, write_tensors
from poslens.rundir.staging import check_replaceable, written_by
from poslens.rundir.outdir import commit_out_dir, create_out_dir, prepare_out_dir
from poslens.rundir.lock import mark_failed, release_out_dir

#: default scan shape: both GGUF models (two scans each) within 5 minutes on an idle 2-core CPU
#: (benchmarks/bench_fingerprint.py)
DEFAULT_SEQ_LEN = 256
DEFAULT_NUM_SEQS = 32


# --------------------------------------------------------------------------------------------
# options and names
# --------------------------------------------------------------------------------------------
@dataclass
class FingerprintConfig:
    """Every option of a fingerprint (the CLI flags one to one)."""

    models: list[str]
    out: str
    data: str = "stdlib"  # the text scan's --data (the random-token scan has the same shape)
    seq_len: int = DEFAULT_SEQ_LEN
    num_seqs: int = DEFAULT_NUM_SEQS
    batch_size: int = 4
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    figures: bool = True
    overwrite: bool = False
    eps: float = SINK_EPS
    kappa: float = SLASH_KAPPA
    massive_lambda: float = MASSIVE_LAMBDA
    allow_pickle: bool = False
    trust_remote_code: bool = False


def _check(cfg: FingerprintConfig, loaded: dict | None = None) -> None:
    if not cfg.models:
        raise PoslensError("fingerprint: no model given; pass one or more model directories or .gguf files.")
    for m in cfg.models:
        if loaded and m in loaded:
            continue
        if not isinstance(m, (str, Path)):
            raise PoslensError(f"fingerprint: {type(m).__name__} is not a model path; pass a Hugging Face model "
                               "directory or a .gguf file (save a loaded model with save_pretrained first).")
        if not Path(m).exists():
            raise PoslensError(f"MODEL {m} does not exist; pass a Hugging Face model directory or a .gguf file "
                               "(`poslens models list` shows the fetched ones).")
    if cfg.seq_len < 4:
        raise PoslensError(f"--seq-len {cfg.seq_len}: the fingerprint needs at least 4 tokens per sequence.")
    if cfg.num_seqs < 2:
        raise PoslensError(f"--num-seqs {cfg.num_seqs}: the noise floor needs at least 2 sequences.")
    require_positive(("--seq-len", cfg.seq_len), ("--num-seqs", cfg.num_seqs), ("--batch-size", cfg.batch_size))
    if not 0 < cfg.eps < 1:
        raise PoslensError(f"--eps {cfg.eps}: the sink threshold must lie in (0, 1), e.g. 0.3.")
    if not 0 < cfg.kappa <= 1:
        raise PoslensError(f"--kappa {cfg.kappa}: the slash threshold must lie in (0, 1], e.g. 0.3.")
    if cfg.massive_lambda <= 1:
        raise PoslensError(f"--massive-lambda {cfg.massive_lambda}: must exceed 1 (Jin et al. use 5).")


# --------------------------------------------------------------------------------------------
# the result
# --------------------------------------------------------------------------------------------
#: the page of a fingerprint, drawn from its summary (findings judged): ``page(summary, figures=bool)`` returns
#: ``{"html": str, "figures": {file: PNG bytes}, "captions": {file: caption}, "tables": [summary.json's tables]}``
#: (:func:`poslens.reporting.fingerprint.fingerprint_page`; the CLI and :func:`poslens.fingerprint` pass it)
Page = Callable[..., dict]


class FingerprintResult:
    """A finished fingerprint: ``summary`` (the content of ``fingerprint.json``), ``models`` (one
    record per model, as in the summary), ``tensors`` (per model, per head), ``table()`` and
    ``save(dir)`` (with ``page``, the page :data:`Page` draws, beside the json)."""

    def __init__(self, summary: dict, tensors: dict[str, dict], path: Path | None = None, page: Page | None = None):
        self.summary = summary
        self.models: list[dict] = summary["models"]
        self.tensors = tensors
        self.path = path
        self.page = page

    def __repr__(self) -> str:
        return f"FingerprintResult({', '.join(m['name'] for m in self.models)}; {self.path or 'not saved'})"

    def table(self, level: str = "layer"):
        """A pandas DataFrame: one row per (model, layer) (``level="layer"``), or per model
        (``level="model"``, the whole-model numbers)."""
        import pandas as pd

        if level == "model":
            rows = []
            for m in self.models:
                o = m["overall"]
                rows.append({"model": m["name"], **{k: v for k, v in o.items() if k != "freq"},
                             **{f"freq_{b}": v for b, v in o["freq"].items()}})
            return pd.DataFrame(rows)
        if level != "layer":
            raise PoslensError(f"table(level={level!r}): choose 'layer' or 'model'.")
        rows = []
        for m in self.models:
            for r in m["layers"]:
                rows.append({"model": m["name"], **{k: v for k, v in r.items()
                                                    if not isinstance(v, (list, dict))},
                             **{f"freq_{b}": v for b, v in r["freq"].items()},
                             **{f"massive_q_{b}": v for b, v in r["massive_q_bands"].items()}})
        return pd.DataFrame(rows)

    def save(self, out: str | Path, *, figures: bool = True, overwrite: bool = False) -> Path:
        """Write ``fingerprint.json``, ``fingerprint.safetensors`` and, with a ``page``, ``fingerprint.html``
        and (with ``figures``) the PNG figures into ``out``; returns ``out``."""
        out = Path(out)
        prepare_out_dir(out)
        existing = [out / f for f in ("fingerprint.json", "fingerprint.html") if (out / f).exists()]
        if existing and not overwrite and out != self.path:
            raise PoslensError(f"{existing[0]} already exists; pass overwrite=True (--overwrite) or another "
                               "directory.")
        out.mkdir(parents=True, exist_ok=True)
        write_fingerprint(out, self.summary, self.tensors, figures=figures, page=self.page)
        self.path = out
        return out


def write_fingerprint(out: Path, summary: dict, tensors: dict[str, dict], *, figures: bool = True,
                      page: Page | None = None) -> None:
    """The files of a fingerprint: json (with the claims' verdict records under ``findings``), tensors
    and, with ``page`` (:data:`Page`), the figures and the page (each written atomically)."""
    flat = {f"{name}.{k}": v.detach().cpu().clone() for name, t in tensors.items() for k, v in t.items()}
    write_tensors(out / "fingerprint.safetensors", flat,
                  metadata={"models": [m["name"] for m in summary["models"]],
                            "layer_convention": LAYER_CONVENTION,
                            "names": "<model>.sink [L, H]: mean weight on key 0 over queries 1..S-1; "
                                     "<model>.freq_<band> [L, H]: share of q.k energy; <model>.freq_pairs "
                                     "[L, H, r/2]; <model>.massive_q/k [L, H(k), D]: Jin et al.'s massive dims"})
    summary["files"] = ["fingerprint.json", "fingerprint.safetensors"] + (["fingerprint.html"] if page else [])
    summary["findings"] = judge_claims(summary["models"], summary["thresholds"])
    drawn = page(summary, figures=figures) if page else {"html": None, "figures": {}, "captions": {}, "tables": []}
    for name, png in drawn["figures"].items():
        _atomic_write_bytes(out / name, png)
        summary["files"].append(name)
    write_json(out / "fingerprint.json", summary)
    if drawn["html"] is not None:
        _atomic_write_bytes(out / "fingerprint.html", drawn["html"].encode("utf-8"))
    if not (out / "config.json").is_file():  # a result saved elsewhere: the options it was made with
        write_json(out / "config.json", {"command": "fingerprint", "options": {k: summary[k] for k in
                                         ("seq_len", "num_seqs", "seed", "thresholds")}, "versions": versions()})
    # the common run-directory summary (poslens report, poslens.load): the traits table, figures, and each
    # model's whole-model numbers (the report reads one line per model from them)
    write_summary(out, {"title": summary["title"], "tables": drawn["tables"],
                        "figures": [{"file": f, "caption": drawn["captions"][f]} for f in drawn["figures"]],
                        "models": [{"name": m["name"], "overall": m["overall"]} for m in summary["models"]],
                        "readings": [], "fingerprint": "fingerprint.json",
                        "files": summary["files"] + ["summary.json", "config.json"]},
                  command="fingerprint", paper=None)


# --------------------------------------------------------------------------------------------
# running it
# --------------------------------------------------------------------------------------------
def _scan_config(model: str, out: Path, data: str, stats: Iterable[str], cfg: FingerprintConfig):
    from poslens.capture.scan.options import ScanConfig

    return ScanConfig(model_dir=str(model), out=str(out), data=data, seq_len=cfg.seq_len, num_seqs=cfg.num_seqs,
                      batch_size=cfg.batch_size, seed=cfg.seed, dtype=cfg.dtype, device=cfg.device,
                      figures=False, overwrite=cfg.overwrite, reservoir=0, stats=list(stats),
                      allow_pickle=cfg.allow_pickle, trust_remote_code=cfg.trust_remote_code)


def _scan(model: str, out: Path, data: str, stats: Iterable[str], cfg: FingerprintConfig, progress: bool,
          loaded=None, tokenizer=None) -> None:
    """One scan of ``model`` (a path, or the label of ``loaded``, a model in memory, read with ``tokenizer``)
    into ``out``."""
    from poslens.capture.scan.run import run_scan

    run_scan(_scan_config(model, out, data, stats, cfg), progress=progress, model=loaded, tokenizer=tokenizer)


def _check_models(cfg: FingerprintConfig, out: Path, loaded: dict, tokenizers: dict) -> None:
    """Every model's two scans planned (config values, weights' headers and shapes, context length,
    data) before anything is written, so a bad model is refused before a good one is scanned."""
    from poslens.capture.scan.plan import plan_scan

    for model in cfg.models:
        for data, stats in ((cfg.data, TEXT_STATS), ("random", RANDOM_STATS)):
            plan_scan(_scan_config(model, out / "scans" / "check", data, stats, cfg), model=loaded.get(model),
                      tokenizer=tokenizers.get(model) if data == cfg.data else None)


def _clear_previous(out: Path, overwrite: bool) -> None:
    """An existing non-empty ``out`` is refused, or with ``overwrite`` emptied of a previous
    fingerprint's files (a directory that holds no fingerprint is refused either way)."""
    if not out.is_dir():
        return
    entries = [p for p in out.iterdir() if not p.name.startswith(".")]
    if not entries:
        return
    if not overwrite:
        raise PoslensError(f"--out {out} already exists and is not empty; pass --overwrite to replace it, or "
                           "choose a new directory.")
    if written_by(out) != "fingerprint" and not (out / "fingerprint.json").is_file():
        raise PoslensError(f"--out {out} is not a run directory of `poslens fingerprint`, so --overwrite will not "
                           "replace it; choose a new directory.")
    check_replaceable(out, "fingerprint")  # the previous run is replaced once the new one is written


def run_fingerprint(cfg: FingerprintConfig, progress: bool = True, *, loaded: dict | None = None,
                    tokenizers: dict | None = None, page: Page | None = None,
                    names: list[str] | None = None) -> FingerprintResult:
    """Scan every model twice (text, random tokens) into ``cfg.out/scans/<model>/``, read the traits
    and write the fingerprint's files into ``cfg.out``. ``loaded`` / ``tokenizers``: models in memory
    and their text tokenizers, by their label in ``cfg.models``; ``page``: the page to draw beside the json
    (:data:`Page`; None: none); ``names``: each model's name in the run (its scans' folder, the prefix of
    its maps), default :func:`~poslens.capture.model.source.model_names`. Every model is checked before the
    first is scanned; a fingerprint replacing another (``overwrite``) is swapped in once complete."""
    loaded = loaded or {}
    names = model_names(cfg.models, names)
    _check(cfg, loaded)
    final = Path(cfg.out)
    prepare_out_dir(final)
    _clear_previous(final, cfg.overwrite)
    _check_models(cfg, final, loaded, tokenizers or {})
    # a fingerprint replacing another is written beside it and swapped in once it is complete
    out = create_out_dir(final, command="fingerprint", overwrite=cfg.overwrite, staged=True)
    try:
        result = _run(cfg, out, names, progress, loaded, tokenizers, page)
        commit_out_dir(final)
    except Exception:
        mark_failed(final)  # a new --out is emptied again when its lock is given back
        raise
    finally:
        release_out_dir(final)
    result.path = final
    return result


def _run(cfg: FingerprintConfig, out: Path, names: list[str], progress: bool, loaded: dict,
         tokenizers: dict | None, page: Page | None) -> FingerprintResult:
    from poslens.progress import task_progress
    from poslens.runtime import no_hf_progress_bars

    # first: an interrupted fingerprint is still recognised as one (--overwrite replaces it)
    write_json(out / "config.json", {"command": "fingerprint", "options": dataclasses.asdict(cfg),
                                     "models": dict(zip(names, cfg.models)), "versions": versions()})
    records, tensors = [], {}
    steps = 3 * len(names)
    # the scans' own bars nest under this one; Hugging Face's loading bars would break the display
    with no_hf_progress_bars(), task_progress("fingerprint", steps, enabled=progress) as update:
        for i, (model, name) in enumerate(zip(cfg.models, names)):
            base = out / "scans" / name
            update(3 * i, info=f"{name}: text")
            _scan(model, base / "text", cfg.data, TEXT_STATS, cfg, progress, loaded.get(model),
                  (tokenizers or {}).get(model))
            update(3 * i + 1, info=f"{name}: random")
            _scan(model, base / "random", "random", RANDOM_STATS, cfg, progress, loaded.get(model))
            update(3 * i + 2, info=f"{name}: traits")
            rec, t = model_traits(base / "text", base / "random", name=name, eps=cfg.eps, kappa=cfg.kappa,
                                  massive_lambda=cfg.massive_lambda)
            rec["model"] = str(model)
            rec["scans"] = {k: str(Path(v).relative_to(out)) for k, v in rec["scans"].items()}
            records.append(rec)
            tensors[name] = t
            update(3 * i + 3)
    summary = build_summary(records, cfg)
    result = FingerprintResult(summary, tensors, page=page)
    out.mkdir(parents=True, exist_ok=True)
    write_fingerprint(out, summary, tensors, figures=cfg.figures, page=page)
    return result


def build_summary(records: list[dict], cfg: FingerprintConfig) -> dict:
    """``fingerprint.json``: the options, the thresholds and their sources, one record per model."""
    return {
        "command": "fingerprint", "title": "Positional fingerprint of " + ", ".join(r["name"] for r in records),
        "seq_len": cfg.seq_len, "num_seqs": cfg.num_seqs, "seed": cfg.seed,
        "data": {"text": cfg.data, "random": "random"}, "stats": {"text": list(TEXT_STATS), "random": list(RANDOM_STATS)},
        "layer_convention": LAYER_CONVENTION,
        "thresholds": {
            "sink_eps": cfg.eps, "slash_kappa": cfg.kappa, "slash_delta": [SLASH_MIN_DELTA, SLASH_MAX_DELTA],
            "massive_lambda": cfg.massive_lambda,
        },
        "verdicts": {"rule": VERDICT_RULE, "level": VERDICT_LEVEL, "thresholds": dict(VERDICT_THRESHOLDS)},
        "definitions": DEFINITIONS,
        "models": records,
        "versions": versions(),
    }


DEFINITIONS = {
    "sink": "each head's mean attention weight on key 0 over queries 1..S-1 and sequences; a sink head exceeds "
            "eps (Gu et al., ICLR 2025); sink_rate: the share of all heads above eps",
    "slash_heads": "heads whose SlashScore(Δ) >= kappa for some Δ in the slash range, at their strongest such Δ; "
                   "persists: still >= kappa on uniformly random tokens (arXiv 2601.08297)",
    "relativity_index": "1 - Var(diagonal-normalised score map) / Var(map), key 0 left out, noise-corrected; "
                        "null where the map is flat against its noise floor (arXiv 2509.21042)",
    "diagonal_trend": "signed trend along the diagonals of the diagonal-normalised map (> 0: the right end higher)",
    "aps": "adjacency probability score per sequence, mean ± sd over sequences (arXiv 2501.00073)",
    "freq": "share of q·k energy per RoPE band: sqrt(E|q_l|^2 E|k_l|^2) per rotary pair from pre-RoPE pair norms, "
            "over the sum of all pairs and unrotated dims (Barbero et al., ICLR 2025); bands by wavelength "
            "against the scanned length (poslens.rope.frequency_bands)",
    "massive": "dims whose RMS over tokens exceeds lambda x the layer's mean RMS over heads and dims (Jin et al., "
               "ICML 2025, Definition 1, lambda = 5), from the pre-RoPE second moments",
}


def fingerprint(models, *, out: str | Path | None = None, data: str = "stdlib", seq_len: int = DEFAULT_SEQ_LEN,
                num_seqs: int = DEFAULT_NUM_SEQS, batch_size: int = 4, seed: int = 0, device: str = "auto",
                dtype: str = "auto", figures: bool = True, overwrite: bool = False, progress: bool = True,
                eps: float = SINK_EPS, kappa: float = SLASH_KAPPA, massive_lambda: float = MASSIVE_LAMBDA,
                allow_pickle: bool = False, trust_remote_code: bool = False,
                page: Page | None = None) -> FingerprintResult:
    """The positional fingerprint of ``models`` (one path or a list: HF directories or ``.gguf`` files).

    ``out``: the directory to write (scans under ``out/scans``); without it the scans go to a
    temporary directory that is removed afterwards, and the result is kept in memory until
    :meth:`FingerprintResult.save`; ``page``: the page to draw beside the json (:data:`Page`)."""
    import tempfile

    if isinstance(models, (str, Path)):
        models = [models]
    models = list(models)
    if out is not None:
        return run_fingerprint(FingerprintConfig(
            models=models, out=str(out), data=str(data), seq_len=seq_len, num_seqs=num_seqs, batch_size=batch_size, seed=seed,
            device=device, dtype=dtype, figures=figures, overwrite=overwrite, eps=eps, kappa=kappa,
            massive_lambda=massive_lambda, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code),
            progress=progress, page=page)
    with tempfile.TemporaryDirectory(prefix="poslens-fingerprint-") as tmp:
        r = run_fingerprint(FingerprintConfig(
            models=models, out=str(Path(tmp) / "run"), data=str(data), seq_len=seq_len, num_seqs=num_seqs, batch_size=batch_size,
            seed=seed, device=device, dtype=dtype, figures=False, eps=eps, kappa=kappa,
            massive_lambda=massive_lambda, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code),
            progress=progress, page=page)
    r.path = None
    return r


def load_fingerprint(path: str | Path, page: Page | None = None) -> FingerprintResult:
    """A written fingerprint read back (``fingerprint.json`` and ``fingerprint.safetensors``); ``page``: the
    page its :meth:`FingerprintResult.save` draws (:data:`Page`)."""
    from poslens.rundir.io import read_json, read_tensors

    p = Path(path)
    if not (p / "fingerprint.json").is_file():
        raise PoslensError(f"{p} has no fingerprint.json; pass the --out directory of `poslens fingerprint`.")
    summary = read_json(p / "fingerprint.json")
    flat = read_tensors(p / "fingerprint.safetensors") if (p / "fingerprint.safetensors").is_file() else {}
    tensors: dict[str, dict] = {}
    for k, v in flat.items():
        name, _, key = k.rpartition(".")
        tensors.setdefault(name, {})[key] = v
    return FingerprintResult(summary, tensors, p, page)
