"""A scan before it runs: ``ScanConfig`` (every option, declared in :mod:`poslens.capture.scan.options`) and
``plan_scan``, which validates every input without writing anything and returns the frozen ``ScanPlan``
the loop runs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from poslens.capture.model.adapters import Adapter
from poslens.capture.engine.spec import CaptureSpec, parse_stats, user_statistics
from poslens.capture.model.borrow import model_device, model_dtype
from poslens.capture.model.load import check_seq_len, load_tokenizer, open_model_config
from poslens.capture.scan.options import ALL_HEADS, ScanConfig
from poslens.data.sources import SequenceSource, make_source, python_source
from poslens.errors import OptionError, PoslensError, require_positive
from poslens.rundir.outdir import check_out_dir, hold_run_dir
from poslens.runtime import parse_device, resolve_dtype


DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


@dataclass(frozen=True)
class ScanPlan:
    """Everything validated and loaded; nothing written yet. Frozen: what only the loaded model tells
    (its dry run, its RoPE tables, where a --device-map placed it) is the run's, not the plan's."""

    cfg: ScanConfig
    config: object
    adapter: Adapter
    spec: CaptureSpec
    source: SequenceSource
    device: str  #: the device asked for (under torchrun each rank resolves its own)
    dtype: torch.dtype


#: the largest seed (seeds are 32-bit, as numpy's; larger ones would overflow the per-sequence streams)
MAX_SEED = 2**32 - 1


def plan_scan(cfg: ScanConfig, *, model=None, tokenizer=None, source: SequenceSource | None = None, data=None,
              lock: bool = False) -> ScanPlan:
    """Validate all inputs and build the sequence source; raises :class:`PoslensError`, writes nothing.

    ``model``: a causal LM already in memory (``poslens.scan``); its config replaces the directory's,
    it runs on its own device(s) and in its own dtype. ``tokenizer`` and ``source``: given by the
    caller instead of read from the model directory / built from ``cfg.data``. ``data``: sequences
    given in memory (:func:`poslens.data.sources.python_source`), packed with the model's tokenizer and
    vocabulary; the plan's ``cfg`` records their label as its ``data``, and their ``seq_len`` and
    ``num_seqs`` where ``cfg`` leaves them None. ``lock``: take --out's lock (for the run about to write
    it, which gives it back) before its contents are checked."""
    check_out_dir(cfg.out, command="scan", overwrite=cfg.overwrite, resume=cfg.resume,
                  hold=(lambda path: hold_run_dir(path, command="scan")) if lock else None)
    stats = parse_stats(cfg.stats)
    where, flag = (f"model {type(model).__name__}", "seq_len") if model is not None else (cfg.model_dir, "--seq-len")
    beyond = bool(cfg.beyond_context)
    if model is not None:
        config, adapter = loaded_model_config(model, seq_len=None if data is not None else cfg.seq_len,
                                              beyond_context=beyond)
    else:
        config, adapter = open_model_config(cfg.model_dir, seq_len=None if data is not None else cfg.seq_len,
                                            allow_pickle=cfg.allow_pickle, trust_remote_code=cfg.trust_remote_code,
                                            beyond_context=beyond)
    if data is not None:  # in memory: its rows give seq_len and num_seqs unless they are set
        if tokenizer is None and isinstance(data, (list, tuple)) and any(isinstance(x, str) for x in data):
            tokenizer = _model_tokenizer(cfg, model)
        source, label = python_source(data, seq_len=cfg.seq_len, num_seqs=cfg.num_seqs, tokenizer=tokenizer,
                                      vocab_size=getattr(config, "vocab_size", None))
        cfg = dataclasses.replace(cfg, data=label, seq_len=source.seq_len, num_seqs=source.num_seqs)
        check_seq_len(adapter, config, cfg.seq_len, where, flag, beyond_context=beyond)
    L = adapter.num_layers(config)
    H = adapter.num_heads(config)
    require_positive(("--batch-size", cfg.batch_size), ("--num-seqs", cfg.num_seqs), ("--seq-len", cfg.seq_len),
                     ("--checkpoint-every", cfg.checkpoint_every), ("--aps-max-positions", cfg.aps_max_positions))
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or not 0 <= cfg.seed <= MAX_SEED:
        raise OptionError("--seed", cfg.seed, f"must be an integer from 0 to {MAX_SEED}.")
    if cfg.map_size < 0:
        raise OptionError("--map-size", cfg.map_size, "must be 0 (full S x S maps) or a positive number of blocks.")
    if cfg.chunk_elems < 0:
        raise OptionError("--chunk-elems", cfg.chunk_elems, "must be 0 (chosen per device) or a positive count.")
    if cfg.reservoir < 0:
        raise OptionError("--reservoir", cfg.reservoir, "must be 0 (none) or a positive number of token slots.")
    layers = list(range(L)) if cfg.layers is None else sorted(set(cfg.layers))
    bad = [l for l in layers if not 0 <= l < L]
    if bad or not layers:
        raise OptionError("--layers", bad or layers, f"the model has layers 0..{L - 1}.")
    bad = [l for l in cfg.no_rope_layers if not 0 <= l < L]
    if bad:
        raise OptionError("--no-rope-layers", bad, f"the model has layers 0..{L - 1}.")
    rope_layers = planned_rope_layers(adapter, config, model, trust_remote_code=cfg.trust_remote_code)
    if cfg.no_rope_layers and not rope_layers:
        raise OptionError("--no-rope-layers", cfg.no_rope_layers, f"model type {adapter.model_type} has no RoPE "
                          "to remove.")
    all_heads = isinstance(cfg.heads, str) and cfg.heads.strip().lower() == ALL_HEADS
    pairs = [] if all_heads else list(cfg.heads)
    for l, h in pairs:
        if l not in layers:
            raise OptionError("--heads", [(l, h)], f"layer {l} is not scanned ({{layers}}); add it or drop the head.",
                              shown=f"{l}.{h}")
        if not 0 <= h < H:
            raise OptionError("--heads", [(l, h)], f"the model has heads 0..{H - 1} per layer.", shown=f"{l}.{h}")
    device = parse_device(cfg.device) if model is None else _loaded_device(model, cfg)
    if cfg.device_map is not None and model is None:
        if cfg.device_map not in DEVICE_MAPS:
            raise OptionError("--device-map", cfg.device_map, f"is not one of {', '.join(DEVICE_MAPS)}.")
        try:
            import accelerate  # noqa: F401
        except ImportError:
            raise PoslensError("--device-map needs the accelerate package: pip install accelerate.") from None
        if cfg.device == "cpu" and torch.cuda.is_available():
            raise PoslensError("--device-map places the model on the visible GPUs; drop --device cpu (or drop "
                               "--device-map to scan on the CPU).")
    dtype = resolve_dtype(cfg.dtype, device, config) if model is None else _loaded_dtype(model, cfg)
    if source is None:
        if tokenizer is None and cfg.data != "random":
            tokenizer = _model_tokenizer(cfg, model) if model is None else text_tokenizer(model, cfg.data)
        source = make_source(cfg.data, seq_len=cfg.seq_len, num_seqs=cfg.num_seqs, seed=cfg.seed, tokenizer=tokenizer,
                             vocab_size=getattr(config, "vocab_size", None))
    spec = CaptureSpec(num_layers=L, num_heads=H, num_kv_heads=adapter.num_kv_heads(config),
                       head_dim=adapter.head_dim(config), seq_len=cfg.seq_len, layers=layers, rope_layers=rope_layers,
                       heads=pairs, head_maps=all_heads, no_rope_layers=set(cfg.no_rope_layers), bidirectional=cfg.bidirectional,
                       chunk_elems=cfg.chunk_elems, reservoir=cfg.reservoir, seed=cfg.seed, stats=stats,
                       aps_max_positions=cfg.aps_max_positions, rope_layout=adapter.rope_layout,
                       map_size=cfg.map_size if 0 < cfg.map_size < cfg.seq_len else 0,
                       user_stats=user_statistics(cfg.stats))
    return ScanPlan(cfg, config, adapter, spec, source, device, dtype)


def planned_rope_layers(adapter: Adapter, config, model=None, *, trust_remote_code: bool = False) -> set[int]:
    """The layers that rotate q/k. An unlisted architecture (the generic adapter) rotates them only where
    its module tree has a rotary module at one of the usual places: looked up in ``model``, or in the
    model built from ``config`` on the meta device (no weights, no memory)."""
    layers = adapter.rope_layers(config)
    if not adapter.generic or not layers:
        return layers
    if model is None:
        from transformers import AutoModelForCausalLM

        try:
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
        except Exception:  # a model class that cannot be built without weights: its config's word stands
            return layers
    return layers if adapter.rotary_modules(model) else set()


# --------------------------------------------------------------------------------------------
# a model already in memory
# --------------------------------------------------------------------------------------------
def loaded_model_config(model, *, seq_len: int | None = None, beyond_context: bool | None = None):
    """``(config, adapter)`` of a loaded causal LM, with the same checks as :func:`open_model_config`."""
    from poslens.capture.model.borrow import check_causal_lm
    from poslens.capture.model.load import checked_adapter

    check_causal_lm(model)
    return model.config, checked_adapter(model.config, f"model {type(model).__name__}", seq_len=seq_len,
                                         flag="seq_len", beyond_context=beyond_context)


def _model_tokenizer(cfg: ScanConfig, model=None):
    """The tokenizer of the model: saved beside a loaded one, or in the model directory; None when it has none."""
    return load_tokenizer(cfg.model_dir, cfg.trust_remote_code) if model is None else loaded_model_tokenizer(model)


def text_tokenizer(model, data: str):
    """The tokenizer a loaded model's named data (``"stdlib"``, a text file) needs, saved beside the model;
    none found is an error in Python's words (``tokenizer=``). Token ids (JSONL) need none."""
    found = loaded_model_tokenizer(model)
    if found is None and not str(data).endswith(".jsonl"):
        raise PoslensError(f"data={str(data)!r} is text, and no tokenizer is saved beside this model (a model loaded "
                           "from a GGUF file or built in memory has none there); pass tokenizer= (e.g. "
                           "AutoTokenizer.from_pretrained(...)), or data='random' or token ids.")
    return found


def loaded_model_tokenizer(model):
    """The tokenizer saved beside a loaded model (``model.name_or_path`` is a local directory or
    ``.gguf`` file), or None."""
    from pathlib import Path

    name = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None)
    if not name or not Path(str(name)).exists():
        return None
    try:
        return load_tokenizer(str(name))
    except PoslensError:
        return None


def _loaded_device(model, cfg: ScanConfig) -> str:
    """A loaded model runs where it is: ``device`` must be ``auto`` or that device."""
    here = model_device(model)
    if cfg.device not in ("auto", None) and torch.device(parse_device(cfg.device)) != torch.device(here) and \
            not (torch.device(here).type == "cuda" and cfg.device == "cuda"):
        raise PoslensError(f"device={cfg.device!r}: the model is on {here}; poslens scans a loaded model where it is "
                           f"(move it with model.to(...) first, or pass device='auto').")
    if cfg.device_map is not None:
        raise PoslensError("device_map: a loaded model is already placed; load it with device_map=... and pass "
                           "the model, without device_map.")
    return here


def _loaded_dtype(model, cfg: ScanConfig) -> torch.dtype:
    """A loaded model runs in its own dtype (its weights are never copied): ``dtype`` must be ``auto`` or that."""
    have = model_dtype(model)
    if cfg.dtype not in ("auto", None) and resolve_dtype(cfg.dtype, "cpu", None) != have:
        raise PoslensError(f"dtype={cfg.dtype!r}: the model's weights are {str(have).replace('torch.', '')}; poslens "
                           "never copies a loaded model's weights. Cast it yourself (model.to(dtype)) or pass "
                           "dtype='auto'.")
    return have
