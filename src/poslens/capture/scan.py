"""``run_scan``: stream sequences through a Hugging Face causal LM and accumulate positional maps.

Flow: validate every input (no writes) -> load the model with the poslens attention function ->
for each batch of the deterministic sequence source: forward, accumulate, checkpoint every N
batches (atomically) -> write ``maps.safetensors``, ``summary.json`` and figures.

A run killed at any moment and restarted with ``resume=True`` continues from the last
checkpoint with the same batch partition, so its tensors are bit-identical to an uninterrupted
run.

Under ``torchrun`` the same loop runs on every rank over its share of the batches (``b % world ==
rank``, :mod:`poslens.capture.distributed`), with one checkpoint per rank; the accumulators are
all-reduced at the end and rank 0 writes the run directory.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from poslens.capture.adapters import Adapter, check_dispatch, get_adapter, layer_rope, rope_tables
from poslens.capture.attention import ATTN_NAME, Capture, CaptureSpec, parse_stats, register
from poslens.capture.loop import forward, forward_kwargs
from poslens.capture.sources import SequenceSource, make_source
from poslens.errors import PoslensError
from poslens.progress import task_progress
from poslens.runtime import no_hf_progress_bars, resolve_dtype

CHECKPOINT = "checkpoint.safetensors"
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")

#: config fields that change the accumulated tensors (a resume must match them exactly)
_FINGERPRINT_FIELDS = ("model_dir", "data", "seq_len", "num_seqs", "batch_size", "seed", "dtype", "layers",
                       "heads", "no_rope_layers", "bidirectional", "chunk_elems", "reservoir", "stats",
                       "aps_max_positions")


@dataclass
class ScanConfig:
    """Every option of a scan (the CLI maps its flags one to one onto these fields)."""

    model_dir: str
    out: str
    data: str = "stdlib"
    seq_len: int = 256
    num_seqs: int = 64
    batch_size: int = 4
    seed: int = 0
    dtype: str = "auto"  # auto | bf16 | fp16 | fp32
    device: str = "auto"  # auto | cpu | cuda[:n]
    layers: list[int] | None = None  # None = all
    heads: list[tuple[int, int]] = field(default_factory=list)  # (layer, head) with per-head S x S maps
    no_rope_layers: list[int] = field(default_factory=list)
    bidirectional: bool = False
    figures: bool = True
    resume: bool = False
    overwrite: bool = False  # replace the files of an existing run directory (else it must be new)
    checkpoint_every: int = 10  # batches
    allow_pickle: bool = False
    trust_remote_code: bool = False
    chunk_elems: int = 0  # logits per capture chunk; 0 = per device (CPU cache-sized, CUDA 2^28)
    aps_max_positions: int = 256
    device_map: str | None = None  # accelerate device map ("auto"...): layers over several devices
    reservoir: int = 256  # token slots whose pre-RoPE q/k vectors are kept (0 = none)
    stats: list[str] | None = None  # statistics to accumulate (names of capture.attention.STATS); None = all
    map_size: int = 0  # S x S maps as block means on an N x N grid (capture.attention.BlockMaps); 0 = full
    keep_checkpoint: bool = False  # keep the checkpoint in a finished run directory


# --------------------------------------------------------------------------------------------
# parsing helpers (shared with the CLI)
# --------------------------------------------------------------------------------------------
def parse_int_list(text: str | None, flag: str) -> list[int] | None:
    """``"0,2,5-7"`` -> ``[0, 2, 5, 6, 7]``; None/empty -> None."""
    if text is None or str(text).strip() in ("", "all"):
        return None
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            if "-" in part[1:]:
                a, b = part.split("-", 1) if not part.startswith("-") else (part, "")
                out.extend(range(int(a), int(b) + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise PoslensError(f"{flag} {text!r}: expected comma-separated integers or ranges like 0,2,5-7.") from None
    return sorted(set(out))


def parse_heads(text: str | None) -> list[tuple[int, int]]:
    """``"3.5,10.2"`` -> ``[(3, 5), (10, 2)]`` (layer.head)."""
    if not text:
        return []
    out = []
    for part in str(text).split(","):
        try:
            l, h = part.strip().split(".")
            out.append((int(l), int(h)))
        except ValueError:
            raise PoslensError(f"--heads {text!r}: expected LAYER.HEAD pairs separated by commas, e.g. 3.5,10.2.") from None
    return sorted(set(out))


# --------------------------------------------------------------------------------------------
# validation and loading
# --------------------------------------------------------------------------------------------
def check_model_dir(model_dir: str, *, allow_pickle: bool, trust_remote_code: bool) -> dict:
    """Refuse missing directories, missing configs, remote code and pickle weights; returns config.json."""
    path = Path(model_dir)
    if not path.exists():
        raise PoslensError(f"MODEL_DIR {path} does not exist; pass a local directory holding config.json and weights, "
                           "or a .gguf file.")
    if not path.is_dir():
        raise PoslensError(f"MODEL_DIR {path} is a file but not a GGUF model; pass the directory holding config.json "
                           "and weights, or a .gguf file.")
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise PoslensError(f"MODEL_DIR {path} has no config.json; pass a Hugging Face model directory "
                           "(save_pretrained output).")
    try:
        raw = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise PoslensError(f"{cfg_path}: not valid JSON ({e.msg}).") from None
    if raw.get("auto_map") and not trust_remote_code:
        raise PoslensError(f"{path} needs custom Python code from the model directory (config.json has auto_map), "
                           "which runs arbitrary code; pass --trust-remote-code only if you trust its source.")
    files = [p for p in path.iterdir() if p.is_file()]
    has_st = any(p.suffix == ".safetensors" for p in files)
    has_pickle = any(p.suffix in PICKLE_SUFFIXES for p in files)
    if not has_st:
        if has_pickle and not allow_pickle:
            raise PoslensError(f"{path} holds only pickle weights (.bin/.pt), which can run arbitrary code when "
                               "loaded; convert them to safetensors, or pass --allow-pickle if you trust them.")
        if not has_pickle:
            raise PoslensError(f"{path} has no weights (*.safetensors); pass a directory written by save_pretrained.")
    return raw


def open_model_config(model_dir: str, *, seq_len: int | None = None, allow_pickle: bool = False,
                      trust_remote_code: bool = False):
    """Check a model directory or ``.gguf`` file (safety, config present), read its config and
    adapter, and check that ``seq_len`` fits the model's positions. Returns ``(config, adapter)``;
    loads no weights (a GGUF file is dequantised into the cache on first use,
    :mod:`poslens.capture.model_source`)."""
    from transformers import AutoConfig

    from poslens.capture.model_source import model_directory

    model_dir = str(model_directory(model_dir))  # a .gguf file: checked, dequantised once into the cache
    check_model_dir(model_dir, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    try:
        config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    except ValueError as e:
        raise PoslensError(f"{model_dir}/config.json: {str(e).splitlines()[0]}") from None
    adapter = get_adapter(config)
    try:  # an architecture without attention geometry (e.g. a state-space model) fails here, in one line
        adapter.num_layers(config), adapter.num_heads(config), adapter.head_dim(config)
    except (AttributeError, TypeError, ValueError, ZeroDivisionError) as e:
        from poslens.capture.adapters import ADAPTERS

        raise PoslensError(f"{model_dir}: model type {getattr(config, 'model_type', None)!r} has no attention "
                           f"geometry poslens can read ({str(e).splitlines()[0][:120]}); supported: "
                           f"{', '.join(sorted(ADAPTERS))}.") from None
    maxpos = adapter.max_positions(config)
    if seq_len is not None and maxpos is not None and seq_len > maxpos:
        raise PoslensError(f"--seq-len {seq_len} exceeds the model's maximum of {maxpos} positions ({model_dir}); "
                           f"pass --seq-len {maxpos} or less.")
    return config, adapter


def load_tokenizer(model_dir: str, trust_remote_code: bool = False):
    """The model's tokenizer (directory or ``.gguf`` file), or None when it has none."""
    from poslens.capture.model_source import model_directory

    p = model_directory(model_dir)
    if not any((p / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(p), trust_remote_code=trust_remote_code)
    except Exception as e:  # a broken tokenizer is a data problem, not a crash
        raise PoslensError(f"{p}: could not load the tokenizer ({type(e).__name__}: {e}); "
                           "pass --data random or pre-tokenised JSONL.") from None


def load_model(model_dir: str, *, dtype: torch.dtype, device: str, allow_pickle: bool = False,
               trust_remote_code: bool = False, device_map: str | None = None):
    """``AutoModelForCausalLM.from_pretrained`` with the poslens attention, eval mode, on ``device``;
    ``model_dir`` may be a ``.gguf`` file (its dequantised cache directory is loaded).

    With ``device_map`` (``auto``, ``balanced``, ``sequential``...) accelerate places the layers over
    the visible devices instead (and offloads to the CPU what does not fit); ``device`` is then unused.
    """
    from transformers import AutoModelForCausalLM

    from poslens.capture.model_source import model_directory

    register()
    extra = {"device_map": device_map} if device_map else {}
    model = AutoModelForCausalLM.from_pretrained(
        str(model_directory(model_dir)), dtype=dtype, attn_implementation=ATTN_NAME,
        use_safetensors=None if allow_pickle else True, trust_remote_code=trust_remote_code, **extra,
    )
    return model.eval() if device_map else model.to(device).eval()


@dataclass
class ScanPlan:
    """Everything validated and loaded; nothing written yet."""

    cfg: ScanConfig
    config: object
    adapter: Adapter
    spec: CaptureSpec
    source: SequenceSource
    device: str
    dtype: torch.dtype
    #: set once the model is loaded: the dry run's per-layer windows / logit scales, the RoPE tables
    attention: dict | None = None
    rope: dict | None = None


def plan_scan(cfg: ScanConfig) -> ScanPlan:
    """Validate all inputs and build the sequence source; raises :class:`PoslensError`, writes nothing."""
    from poslens.runtime import parse_device
    from poslens.rundir import prepare_out_dir

    stats = parse_stats(cfg.stats)
    config, adapter = open_model_config(cfg.model_dir, seq_len=cfg.seq_len, allow_pickle=cfg.allow_pickle,
                                        trust_remote_code=cfg.trust_remote_code)
    L = adapter.num_layers(config)
    H = adapter.num_heads(config)
    for flag, val in (("--batch-size", cfg.batch_size), ("--num-seqs", cfg.num_seqs), ("--seq-len", cfg.seq_len),
                      ("--checkpoint-every", cfg.checkpoint_every)):
        if val < 1:
            raise PoslensError(f"{flag} {val}: must be a positive integer.")
    if cfg.map_size < 0:
        raise PoslensError(f"--map-size {cfg.map_size}: must be 0 (full S x S maps) or a positive number of blocks.")
    if cfg.reservoir < 0:
        raise PoslensError(f"--reservoir {cfg.reservoir}: must be 0 (none) or a positive number of token slots.")
    layers = list(range(L)) if cfg.layers is None else sorted(set(cfg.layers))
    bad = [l for l in layers if not 0 <= l < L]
    if bad or not layers:
        raise PoslensError(f"--layers {bad or layers}: the model has layers 0..{L - 1}.")
    bad = [l for l in cfg.no_rope_layers if not 0 <= l < L]
    if bad:
        raise PoslensError(f"--no-rope-layers {bad}: the model has layers 0..{L - 1}.")
    rope_layers = adapter.rope_layers(config)
    if cfg.no_rope_layers and not rope_layers:
        raise PoslensError(f"--no-rope-layers: model type {adapter.model_type} has no RoPE to remove.")
    for l, h in cfg.heads:
        if l not in layers:
            raise PoslensError(f"--heads {l}.{h}: layer {l} is not scanned (--layers); add it or drop the head.")
        if not 0 <= h < H:
            raise PoslensError(f"--heads {l}.{h}: the model has heads 0..{H - 1} per layer.")
    device = parse_device(cfg.device)
    if cfg.device_map is not None:
        if cfg.device_map not in DEVICE_MAPS:
            raise PoslensError(f"--device-map {cfg.device_map!r} is not one of {', '.join(DEVICE_MAPS)}.")
        try:
            import accelerate  # noqa: F401
        except ImportError:
            raise PoslensError("--device-map needs the accelerate package: pip install accelerate.") from None
        if cfg.device == "cpu" and torch.cuda.is_available():
            raise PoslensError("--device-map places the model on the visible GPUs; drop --device cpu (or drop "
                               "--device-map to scan on the CPU).")
    dtype = resolve_dtype(cfg.dtype, device, config)
    if cfg.resume and cfg.overwrite:
        raise PoslensError("--resume and --overwrite contradict each other; pass one.")
    prepare_out_dir(cfg.out, must_be_new=not (cfg.resume or cfg.overwrite))
    tokenizer = None
    if cfg.data != "random":
        tokenizer = load_tokenizer(cfg.model_dir, cfg.trust_remote_code)
    source = make_source(cfg.data, seq_len=cfg.seq_len, num_seqs=cfg.num_seqs, seed=cfg.seed, tokenizer=tokenizer,
                         vocab_size=getattr(config, "vocab_size", None))
    spec = CaptureSpec(num_layers=L, num_heads=H, num_kv_heads=adapter.num_kv_heads(config),
                       head_dim=adapter.head_dim(config), seq_len=cfg.seq_len, layers=layers, rope_layers=rope_layers,
                       heads=list(cfg.heads), no_rope_layers=set(cfg.no_rope_layers), bidirectional=cfg.bidirectional,
                       chunk_elems=cfg.chunk_elems, reservoir=cfg.reservoir, seed=cfg.seed, stats=stats,
                       aps_max_positions=cfg.aps_max_positions, rope_layout=adapter.rope_layout,
                       map_size=cfg.map_size if 0 < cfg.map_size < cfg.seq_len else 0)
    return ScanPlan(cfg, config, adapter, spec, source, device, dtype)


# --------------------------------------------------------------------------------------------
# capture wiring
# --------------------------------------------------------------------------------------------
def attach(model, adapter: Adapter, capture: Capture) -> list:
    """Hooks that feed the capture (only while it is active): the rotary cos/sin each layer's attention
    receives, and the residual stream at the adapter's capture points (``resid_pre`` of layer 0 = the
    embeddings, ``resid_post`` of every captured layer). Returns the handles (``h.remove()`` detaches)."""
    from poslens.capture import attention as _attn
    from poslens.capture.adapters import hook_point, hook_position_embeddings

    handles = []
    layers = adapter.decoder_layers(model)
    if capture.spec.rope_layers:
        def _rope(layer, cos_sin):
            if _attn._ACTIVE is capture:
                capture.rope_by_layer[layer] = (cos_sin[0], cos_sin[1])
        handles += [hook_position_embeddings(model, adapter, l, _rope) for l in range(len(layers))]

    if "cosine" not in capture.spec.stats:
        return handles  # residual-stream vectors are read only for the cosine maps

    def _emb(x):
        if _attn._ACTIVE is capture:
            capture.observe_hidden(0, x)
    handles.append(hook_point(model, adapter, "resid_pre", 0, _emb))
    for k, l in enumerate(capture.spec.layers):
        def _post(x, index=k + 1):
            if _attn._ACTIVE is capture:
                capture.observe_hidden(index, x)
        handles.append(hook_point(model, adapter, "resid_post", l, _post))
    return handles


def fingerprint(cfg: ScanConfig) -> str:
    d = {k: getattr(cfg, k) for k in _FINGERPRINT_FIELDS}
    d["stats"] = sorted(parse_stats(cfg.stats))
    if cfg.map_size:  # only when set, so checkpoints of full-map scans keep their fingerprint
        d["map_size"] = cfg.map_size
    d["model_dir"] = str(Path(cfg.model_dir).resolve())
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_checkpoint(out: Path, capture: Capture, next_seq: int, fp: str, *, name: str = CHECKPOINT,
                    extra: dict | None = None) -> None:
    from poslens.rundir import write_tensors

    write_tensors(out / name, capture.state_dict(),
                  metadata={"next_seq": next_seq, "fingerprint": fp, **(extra or {})})


def _checkpoint_meta(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    return {k: json.loads(v) for k, v in meta.items()}


def load_checkpoint(out: Path, capture: Capture, fp: str, *, name: str = CHECKPOINT) -> int:
    """Load accumulators from ``out/name``; returns the next sequence index (0 if none).

    For a rank checkpoint of a distributed run the returned value is the number of that rank's
    own batches already accumulated (``batches_done``)."""
    path = out / name
    if not path.exists():
        return 0
    meta = _checkpoint_meta(path)
    if meta.get("fingerprint") != fp:
        raise PoslensError(f"--resume: {path} was written by a scan with different options; rerun with the "
                           "original options or choose a new --out.")
    from poslens.rundir import read_tensors

    capture.load_state_dict(read_tensors(path), copy=False)  # fresh from the file: adopt, do not copy
    return int(meta["batches_done"]) if "batches_done" in meta else int(meta["next_seq"])


def _rank_checkpoints(out: Path) -> dict[int, Path]:
    found = {}
    for f in out.glob("checkpoint.rank*.safetensors"):
        r = f.name[len("checkpoint.rank"):-len(".safetensors")]
        if r.isdigit():
            found[int(r)] = f
    return found


def _check_resume_layout(out: Path, world_size: int) -> None:
    """Refuse to resume a run under a different number of processes than wrote its checkpoints."""
    ranks = _rank_checkpoints(out)
    if world_size == 1:
        if ranks:
            w = _checkpoint_meta(next(iter(ranks.values()))).get("world_size", "several")
            raise PoslensError(f"--resume: {out} holds the per-rank checkpoints of a {w}-process distributed scan; "
                               f"resume it with torchrun --nproc-per-node/--nnodes giving {w} processes in all.")
        return
    if not ranks and (out / CHECKPOINT).exists():
        raise PoslensError(f"--resume: {out}/{CHECKPOINT} was written by a single-process scan; resume it without "
                           "torchrun (or start a new --out for a distributed scan).")
    for r, f in sorted(ranks.items()):
        w = _checkpoint_meta(f).get("world_size")
        if w != world_size or r >= world_size:
            raise PoslensError(f"--resume: {out} holds checkpoints of a {w}-process distributed scan but this job has "
                               f"{world_size} processes; relaunch with {w} processes in all (the shards differ).")


# --------------------------------------------------------------------------------------------
# the scan
# --------------------------------------------------------------------------------------------
def run_scan(cfg: ScanConfig, progress: bool = True, *, stop_after_batches: int | None = None) -> dict:
    """Run (or resume) a scan and write its run directory; returns the summary dict.

    Under ``torchrun`` (``WORLD_SIZE`` > 1) every rank scans its shard of the batches
    (:mod:`poslens.capture.distributed`), the accumulators are all-reduced and rank 0 alone
    writes the run directory; other ranks return ``{"rank": r, "world_size": w}``.

    ``stop_after_batches`` ends the loop early after that many batch steps of this call, leaving
    a checkpoint as a killed run would (used by tests of resume).
    """
    from poslens.capture import distributed as D

    ctx = D.detect()
    restore = D.announce_sigterm(ctx)
    try:
        return _run_scan(cfg, progress, stop_after_batches, ctx)
    except PoslensError as e:
        if ctx.enabled and not str(e).startswith("rank "):
            raise PoslensError(f"{ctx.label}: {e}") from None
        raise
    except Exception as e:  # e.g. CUDA out of memory: say which rank before the traceback
        if ctx.enabled:
            print(f"poslens: error: {ctx.label}: {type(e).__name__}: {str(e).strip()[:300]}", file=sys.stderr,
                  flush=True)
        raise
    finally:
        restore()
        ctx.shutdown()


def _run_scan(cfg: ScanConfig, progress: bool, stop_after_batches: int | None, ctx) -> dict:
    from poslens.capture import distributed as D
    from poslens.capture.model_source import source_record
    from poslens.rundir import create_out_dir, versions, write_json, write_summary

    t_start = time.time()
    # every rank validates before any rank creates --out (else a fast rank 0 makes it "not empty")
    err = None
    try:
        plan = plan_scan(cfg)
        if ctx.enabled and cfg.device_map and ctx.local_world_size > 1:
            raise PoslensError(f"--device-map spreads one model over this node's devices; launch one process per "
                               f"node (--nproc-per-node 1), not {ctx.local_world_size}.")
        device = D.resolve_device(ctx, plan.device)
        ck_name = D.checkpoint_name(ctx.rank) if ctx.enabled else CHECKPOINT
        out = Path(cfg.out)
        fp = fingerprint(cfg)
        if cfg.resume and out.is_dir():  # refuse a mismatched resume before anything is loaded or written
            _check_resume_layout(out, ctx.world_size)
            if (out / ck_name).exists() and _checkpoint_meta(out / ck_name).get("fingerprint") != fp:
                raise PoslensError(f"--resume: {out / ck_name} was written by a scan with different options; rerun "
                                   "with the original options or choose a new --out.")
    except PoslensError as e:
        err = e  # still join the group (same backend as the others) so every rank can be told
        device = f"cuda:{ctx.local_rank}" if torch.cuda.is_available() and cfg.device != "cpu" else "cpu"
    D.init(ctx, device)
    if not ctx.all_ok(err is None, device):
        raise err or PoslensError("another rank rejected the inputs (its error is printed above).")
    plan.device = device
    if ctx.is_main:
        create_out_dir(out)
    # one set of loading bars per job; none with --quiet
    with no_hf_progress_bars((ctx.enabled and not ctx.is_main) or not progress):
        model = load_model(cfg.model_dir, dtype=plan.dtype, device=plan.device, allow_pickle=cfg.allow_pickle,
                           trust_remote_code=cfg.trust_remote_code, device_map=cfg.device_map)
    try:  # every layer must dispatch through the registered attention (custom attention code: refused)
        plan.attention = check_dispatch(model, plan.adapter)
    except PoslensError:
        if ctx.is_main and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # nothing written
        raise
    plan.rope = rope_tables(model, plan.adapter, plan.config)
    if plan.adapter.generic and plan.rope is None:  # an unlisted architecture without a rotary module: no RoPE
        plan.spec.rope_layers = set()
    if cfg.device_map:
        plan.device = D.main_device(model)
        capture = D.DeviceMapCapture(plan.spec, device=plan.device)
    else:
        capture = Capture(plan.spec, device=plan.device)
    if ctx.is_main:
        write_json(out / "config.json", {"command": "scan", "options": dataclasses.asdict(cfg), "fingerprint": fp,
                                         "model_source": source_record(cfg.model_dir),
                                         "source": plan.source.describe(), "model_type": plan.adapter.model_type,
                                         "dtype": str(plan.dtype), "device": plan.device,
                                         "world_size": ctx.world_size,
                                         "device_map": (getattr(model, "hf_device_map", None) or {"": plan.device})
                                         if cfg.device_map else None,
                                         "versions": versions()})
    ctx.barrier(device)
    if not out.is_dir():
        raise PoslensError(f"--out {out} is not visible from this rank's host; a multi-node scan needs --out on a "
                           "filesystem shared by every node.")
    N, Bsz = plan.source.num_seqs, cfg.batch_size
    batches = [(s, min(N, s + Bsz)) for s in range(0, N, Bsz)]
    mine = [batches[b] for b in D.shard(len(batches), ctx.rank, ctx.world_size)]
    if ctx.enabled:
        done = load_checkpoint(out, capture, fp, name=ck_name) if cfg.resume else 0
        ck_extra = {"rank": ctx.rank, "world_size": ctx.world_size}
    else:
        start = load_checkpoint(out, capture, fp) if cfg.resume else 0
        done = sum(1 for b in batches if b[0] < start)
        ck_extra = {}
    steps = len(D.shard(len(batches), 0, ctx.world_size))  # rank 0 has the most batches
    first_step = ctx.all_min([done], device)[0]
    already = int(ctx.all_sum([done], device)[0])

    def checkpoint(n_done: int) -> None:
        if ctx.enabled:
            save_checkpoint(out, capture, mine[n_done - 1][1] if n_done else 0, fp, name=ck_name,
                            extra={**ck_extra, "batches_done": n_done})
        else:
            save_checkpoint(out, capture, mine[n_done - 1][1] if n_done else 0, fp)

    handles = attach(model, plan.adapter, capture)
    fwd_kwargs = forward_kwargs(model)  # no cache; logits_to_keep=1: the LM head's [B, S, vocab] logits are unused
    tokens = 0
    t_loop = time.time()
    try:
        shown = already
        with task_progress("scan", len(batches), enabled=progress and ctx.is_main, done=already) as update:
            for n_step, t in enumerate(range(first_step, steps), 1):
                did = 0
                if done <= t < len(mine):
                    s, e = mine[t]
                    ids = plan.source.batch(s, e).to(plan.device)
                    forward(model, ids, capture=capture, kwargs=fwd_kwargs, seq_start=s)
                    tokens += ids.numel()
                    done, did = t + 1, 1
                    if done == len(mine) or done % cfg.checkpoint_every == 0:
                        checkpoint(done)
                    D.die_hook(ctx, done)
                # lockstep: the global count for the progress bar, and a dead peer is noticed at once
                ctx.reach(t + 1)
                shown += int(ctx.all_sum([did], device)[0]) if ctx.enabled else did
                update(shown)
                if stop_after_batches is not None and n_step >= stop_after_batches and t + 1 < steps:
                    checkpoint(done)
                    return {"stopped_at": mine[done - 1][1]} if not ctx.enabled else {
                        "stopped_at_step": t + 1, "rank": ctx.rank, "world_size": ctx.world_size}
            if ctx.enabled and done == len(mine) and len(mine) == 0:
                checkpoint(0)  # a rank without batches still marks its (empty) shard as done
    finally:
        for h in handles:
            h.remove()
    elapsed = time.time() - t_loop
    del model  # free the weights before the results are merged and written (sums and maps are as large)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if ctx.enabled:
        ctx.guard(lambda: capture.all_reduce())
        tokens = int(ctx.all_sum([tokens], device)[0])
        elapsed = ctx.all_max([elapsed], device)[0]
        if not ctx.is_main:
            return {"rank": ctx.rank, "world_size": ctx.world_size}
        # the merged float64 sums, as a single-process run leaves them
        save_checkpoint(out, capture, N, fp, extra={"world_size": ctx.world_size, "merged": True})
    summary = finalize(out, capture, plan, figures=cfg.figures)
    summary["throughput"] = {"tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed if elapsed else None,
                             "wall_s": time.time() - t_start, "processes": ctx.world_size}
    summary = write_summary(out, summary, command="scan", paper=["kim", "slash", "neighborhood"],
                            layers_describe="each decoder layer's attention (scores, heads, pre-RoPE q/k); aps and "
                                            "norm_score: the residual stream after that layer (embedding_aps: the "
                                            "embeddings)")
    if not cfg.keep_checkpoint:  # finished: the checkpoint (as large as the float64 sums) has done its job
        for f in [out / CHECKPOINT, *_rank_checkpoints(out).values()]:
            f.unlink(missing_ok=True)
    return summary


# --------------------------------------------------------------------------------------------
# outputs
# --------------------------------------------------------------------------------------------
def causal_view(m: torch.Tensor, include_diagonal: bool = True) -> torch.Tensor:
    """NaN above the diagonal (entries a causal query never sees)."""
    S = m.shape[-1]
    i = torch.arange(S)
    keep = i[:, None] >= i[None, :] if include_diagonal else i[:, None] > i[None, :]
    return torch.where(keep.to(m.device), m, torch.full_like(m, float("nan")))


def window_view(m: torch.Tensor, window: int | None) -> torch.Tensor:
    """NaN where the key is ``window`` or more positions before the query (outside a sliding window)."""
    if not window or window >= m.shape[-1]:
        return m
    i = torch.arange(m.shape[-1], device=m.device)
    far = (i[:, None] - i[None, :]) >= window
    return m.masked_fill(far, float("nan"))


def _subsample(m: torch.Tensor, k: int) -> torch.Tensor:
    S = m.shape[-1]
    if S <= k:
        return m
    idx = torch.linspace(0, S - 1, k).round().long()
    return m[..., idx, :][..., idx] if m.ndim >= 2 and m.shape[-2] == S else m[..., idx]


def _opt(x):
    return None if x is None else float(x)


#: key columns left out of whole-map statistics by default: real models put most attention on key 0
#: (the attention sink, the BOS position), which otherwise dominates relativity and locality
SINK_COLUMNS = (0,)

LAYER_CONVENTION = "decoder layers from 0; 'embeddings' = the input of decoder layer 0"


def _per_sequence(acc) -> tuple[list, list]:
    """Mean and standard deviation over sequences of a per-sequence statistic's accumulator."""
    mean = acc.mean.tolist()
    std = acc.var.sqrt().tolist() if acc.count >= 2 else [None] * len(mean)
    return mean, std


def score_map_numbers(sc: torch.Tensor, groups: torch.Tensor | None, counts: torch.Tensor | None, grid: torch.Tensor,
                      locality_positions: int, sink_columns=SINK_COLUMNS, grid_map: torch.Tensor | None = None) -> dict:
    """The score-map numbers of one layer: sink-excluded headline values on the full map (relativity
    index, locality on at most ``locality_positions`` positions, signed diagonal trend, within-diagonal
    RMS), the with-sink values beside them, and the noise floor from the group maps on ``grid``
    (p-values, RMS noise floor, trend standard error: :func:`poslens.metrics.diagonal.describe_map`).
    Where ``grid`` is coarser than the map, the same statistics of the grid map (``grid_*``, the ones
    the p-values and standard error test) are given too, under ``noise_positions`` positions."""
    from poslens.metrics import describe_map, locality, relativity_index

    sub = _subsample(sc, locality_positions)
    out = describe_map(sc, exclude_keys=sink_columns, locality_map=sub)
    if groups is not None and groups.shape[0] >= 2:
        g = causal_view(groups, include_diagonal=True)
        on_grid = sc[grid][:, grid] if grid_map is None else grid_map  # grid_map: the mean map on the grid
        noise = describe_map(causal_view(on_grid), g, counts, exclude_keys=sink_columns)
        for key in ("flat_p", "nonrelative_p", "trend_p", "within_diag_rms_noise", "diagonal_trend_se", "noise_groups"):
            out[key] = noise.get(key)
        out["flat"] = bool(noise["flat"])
        out["noise_positions"] = int(grid.numel())
        if grid.numel() < sc.shape[-1]:
            # the p-values, noise floor and standard error belong to the statistics of the grid map: give
            # those beside the full-map headline numbers, so each uncertainty sits next to its own statistic
            for key in ("relativity_index", "diagonal_trend", "within_diag_rms", "locality"):
                out[f"grid_{key}"] = noise.get(key)
        out.pop("noise", None)
        if noise.get("noise"):
            out["noise"] = noise["noise"]
        if out["flat"]:
            out["relativity_index"] = out["locality"] = None
    else:
        out["noise"] = "no noise estimate: fewer than two sequence groups (scan at least 2 sequences)"
    flat = out["flat"] and groups is not None and groups.shape[0] >= 2
    out["relativity_index_with_sink"] = None if flat else _opt(relativity_index(sc))
    out["locality_with_sink"] = None if flat else _opt(locality(sub))
    out["sink_columns"] = list(sink_columns)
    return out


def map_view(m: torch.Tensor, window: int | None, blocks=None, causal: bool = True) -> torch.Tensor:
    """A stored score/weight map as the summary reads it: NaN where no query sees the entry (above the
    diagonal, outside a sliding window); a block map (``--map-size``) NaN in the blocks without a
    visible entry."""
    if blocks is None:
        return window_view(causal_view(m, include_diagonal=True), window)
    empty = blocks.counts(causal, window) == 0
    return m.masked_fill(empty.to(m.device), float("nan"))


def _grid_mean(groups: torch.Tensor, counts: torch.Tensor | None, li: int) -> torch.Tensor | None:
    """Layer ``li``'s mean score map on the noise grid, from the group means and their counts (what
    ``scores[grid][:, grid]`` is for a full map; a block map has no grid entries)."""
    if counts is None or not groups.shape[0]:
        return None
    w = counts.to(torch.float64)
    return (groups[:, li].cpu() * w[:, None, None]).sum(0) / w.sum()


def _grid_groups(groups: torch.Tensor, li: int, grid: torch.Tensor, window: int | None) -> torch.Tensor | None:
    """Layer ``li``'s group maps on the noise grid, NaN outside a sliding window (as the full map)."""
    if not groups.shape[0]:
        return None
    g = groups[:, li].cpu()
    if window and window < int(grid[-1]) + 1:
        far = (grid[:, None] - grid[None, :]) >= window
        g = g.masked_fill(far, float("nan"))
    return g


def finalize(out: Path, capture: Capture, plan: ScanPlan, figures: bool = True) -> dict:
    """Write ``maps.safetensors`` (float32 means) and figures; return the summary dict.

    Decoder layers count from 0. Score-map statistics leave out the sink column (key 0) by default
    and give the with-sink values beside them; the APS is the paper's per-sequence APS (mean and
    std over sequences), the APS of the mean map is ``mean_map_aps``.
    """
    from poslens.capture.attention import noise_grid
    from poslens.metrics import adjacency_probability_score, norm_score
    from poslens.metrics.rank import band_contributions, rank_measures
    from poslens.metrics.slash import SLASH_MAX_DELTA, SLASH_MIN_DELTA, scored_offsets, sink_weight, top_slash_heads
    from poslens.rundir import write_tensors

    cfg, spec, adapter, config = plan.cfg, plan.spec, plan.adapter, plan.config
    n_seqs = next(iter(capture.accs.values())).count
    has = capture.accs.__contains__  # statistics not asked for (--stats) read as None in the summary

    def mean(name: str, idx=slice(None)) -> torch.Tensor:
        """float64 mean of one accumulator at ``idx``: the summary reads layer by layer, before the sums are freed."""
        return capture.accs[name].mean_at(idx)

    def when(name: str, fn):
        return fn() if has(name) else None

    k = cfg.aps_max_positions
    rot_dim, base = adapter.rotary_dim(config), adapter.rope_base(config)
    groups, counts = capture.accs["score_groups"].group_means() if has("score_groups") else (torch.zeros(0), None)
    grid = noise_grid(spec.seq_len, spec.noise_max_positions)
    nl = len(spec.layers)
    aps_mean, aps_std = _per_sequence(capture.accs["aps_seq"]) if has("aps_seq") else ([None] * (nl + 1),) * 2
    attn_aps_mean, attn_aps_std = _per_sequence(capture.accs["attn_aps_seq"]) if has("attn_aps_seq") \
        else ([None] * nl,) * 2
    windows = (plan.attention or {}).get("windows") or [None] * spec.num_layers
    blocks = capture.blocks  # --map-size: the S x S maps are block means
    layers = []
    for li, l in enumerate(spec.layers):
        # entries outside a sliding window are unseen (stored as 0, like above the diagonal): NaN here
        sc = map_view(mean("scores", li), windows[l], blocks, causal=not spec.bidirectional) if has("scores") else None
        rm_q = when("q_gram", lambda: rank_measures(mean("q_gram", li)))
        rm_k = when("k_gram", lambda: rank_measures(mean("k_gram", li)))
        table = layer_rope(plan.rope, l)  # the model's own frequencies (scaled RoPE, Gemma 3's two bases)
        bands = when("dim_logit", lambda: band_contributions(
            mean("dim_logit", li), rot_dim if l in spec.rope_layers else None, base, spec.seq_len,
            inv_freq=table["inv_freq"] if table else None))
        layers.append({
            "layer": l,
            "rope": l in spec.rope_layers and l not in spec.no_rope_layers,
            "sliding_window": windows[l],
            **(score_map_numbers(sc, _grid_groups(groups, li, grid, windows[l]), counts, grid, k,
                                 grid_map=None if blocks is None else _grid_mean(groups, counts, li))
               if sc is not None else {}),
            "sink_weight": when("probs", lambda: float(
                sink_weight(mean("probs", li)) if blocks is None else mean("probs_key0", li)[1:].mean())),
            "aps": aps_mean[li + 1],  # = aps_mean: the paper's per-sequence APS (before, the mean map's)
            "aps_mean": aps_mean[li + 1],
            "aps_std": aps_std[li + 1],
            "attn_aps": attn_aps_mean[li],
            "attn_aps_mean": attn_aps_mean[li],
            "attn_aps_std": attn_aps_std[li],
            "mean_map_aps": when("cosine", lambda: float(adjacency_probability_score(
                _subsample(mean("cosine", li + 1), k)))),
            "attn_mean_map_aps": when("attn_cosine", lambda: float(adjacency_probability_score(
                _subsample(mean("attn_cosine", li), k)))),
            "norm_score": when("norms", lambda: float(norm_score(_subsample(mean("norms", li + 1), k)))),
            "top_slash_heads": when("slash", lambda: top_slash_heads(mean("slash", slice(li, li + 1)), k=3,
                                                                     layer_ids=[l])) or [],
            "q_top1_energy": rm_q["top1_energy"].tolist() if rm_q else None,
            "k_top1_energy": rm_k["top1_energy"].tolist() if rm_k else None,
            "q_effective_rank": rm_q["effective_rank"].tolist() if rm_q else None,
            "k_effective_rank": rm_k["effective_rank"].tolist() if rm_k else None,
            "band_logit": {b: v.tolist() for b, v in bands.items()} if bands is not None else None,
        })
    offs = scored_offsets(spec.seq_len, SLASH_MIN_DELTA, SLASH_MAX_DELTA)
    summary = {
        "model_dir": str(cfg.model_dir),
        "model_type": adapter.model_type,
        "num_seqs": n_seqs,
        "seq_len": spec.seq_len,
        "layer_convention": LAYER_CONVENTION,
        "stats": sorted(spec.stats),
        # --map-size: S x S maps stored as block means (n x n blocks of `block` positions; see docs/scan.md)
        "map_size": {"blocks": blocks.n, "block": blocks.f,
                     "masked": "blocks without a visible (causal, in-window) entry are NaN; others average "
                               "their visible entries"} if blocks is not None else None,
        "controls": {"no_rope_layers": sorted(spec.no_rope_layers), "bidirectional": spec.bidirectional},
        "reservoir_slots": capture.reservoir.filled if capture.reservoir is not None else 0,
        "embedding_aps": aps_mean[0],
        "embedding_aps_mean": aps_mean[0],
        "embedding_aps_std": aps_std[0],
        "embedding_mean_map_aps": when("cosine", lambda: float(adjacency_probability_score(
            _subsample(mean("cosine", 0), k)))),
        "aps_positions": min(k, spec.seq_len),
        "sink_columns": list(SINK_COLUMNS),
        "noise": {"groups": int(groups.shape[0]), "grid_positions": int(grid.numel()),
                  "group_rule": "sequence n in group n % " + str(spec.noise_groups)},
        "layers": layers,
        "slash_offsets": [offs.start, offs.stop - 1] if len(offs) else None,
        "slash_top_heads": when("slash", lambda: top_slash_heads(mean("slash"), k=10, layer_ids=spec.layers)) or [],
        "files": ["config.json", "maps.safetensors", "summary.json"],
        "rope": plan.rope,
        "attention": plan.attention,
    }
    # float32 means for the file, converted in place one accumulator at a time (the capture is spent)
    tensors = capture.release_means(torch.float32)
    if capture.reservoir is not None:
        tensors.update(capture.reservoir.result())
    write_tensors(out / "maps.safetensors", tensors,
                  metadata={"layers": spec.layers, "heads": [list(h) for h in spec.heads], "num_seqs": n_seqs,
                            "seq_len": spec.seq_len, "cosine_index": "0 = embeddings, k = output of layers[k-1]",
                            "rope": plan.rope, "attention": plan.attention,
                            "layer_convention": LAYER_CONVENTION,
                            "map_block": blocks.f if blocks is not None else 1,
                            "score_groups": "[g, L, n, n] scores of sequence groups on positions 0, s, 2s, ... "
                                            f"(n = {grid.numel()}); score_group_counts: sequences per group",
                            "aps_seq": "per-sequence APS, mean over sequences (index as cosine)"})
    if figures and "scores" in tensors:
        from poslens.report.plots import ZOOM_POSITIONS, score_map_figures  # matplotlib: only when drawing

        summary["files"] += score_map_figures(causal_view(tensors["scores"]), out, layer_ids=spec.layers,
                                              zoom=ZOOM_POSITIONS,
                                              block=blocks.f if blocks is not None else 1)
    return summary


