"""``run_scan``: stream sequences through a Hugging Face causal LM and accumulate positional maps.

Flow: validate every input (no writes) -> load the model with the poslens attention function ->
for each batch of the deterministic sequence source: forward, accumulate, checkpoint every N
batches (atomically) -> write ``maps.safetensors``, ``summary.json`` and figures.

A run killed at any moment and restarted with ``resume=True`` continues from the last
checkpoint with the same batch partition, so its tensors are bit-identical to an uninterrupted
run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from poslens.capture.adapters import Adapter, get_adapter
from poslens.capture.attention import ATTN_NAME, Capture, CaptureSpec, register
from poslens.capture.sources import SequenceSource, make_source
from poslens.errors import PoslensError

CHECKPOINT = "checkpoint.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")

#: config fields that change the accumulated tensors (a resume must match them exactly)
_FINGERPRINT_FIELDS = ("model_dir", "data", "seq_len", "num_seqs", "batch_size", "seed", "dtype", "layers",
                       "heads", "no_rope_layers", "bidirectional", "chunk_elems")


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
    checkpoint_every: int = 10  # batches
    allow_pickle: bool = False
    trust_remote_code: bool = False
    chunk_elems: int = 2**23
    aps_max_positions: int = 256


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
        raise PoslensError(f"MODEL_DIR {path} does not exist; pass a local directory holding config.json and weights.")
    if not path.is_dir():
        raise PoslensError(f"MODEL_DIR {path} is a file; pass the directory holding config.json and weights.")
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


def resolve_dtype(dtype: str, device: str, config) -> torch.dtype:
    names = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
             "fp32": torch.float32, "float32": torch.float32}
    if dtype in names:
        return names[dtype]
    if dtype != "auto":
        raise PoslensError(f"--dtype {dtype!r} is not one of auto, bf16, fp16, fp32.")
    if device.startswith("cuda"):
        d = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        if isinstance(d, str):
            d = names.get(d.replace("torch.", ""), None)
        return d if isinstance(d, torch.dtype) and d != torch.float32 else torch.bfloat16
    return torch.float32  # CPU: half-precision matmuls are slow and bring nothing


def load_tokenizer(model_dir: str, trust_remote_code: bool = False):
    """The model directory's tokenizer, or None when it has none."""
    p = Path(model_dir)
    if not any((p / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(p), trust_remote_code=trust_remote_code)
    except Exception as e:  # a broken tokenizer is a data problem, not a crash
        raise PoslensError(f"{p}: could not load the tokenizer ({type(e).__name__}: {e}); "
                           "pass --data random or pre-tokenised JSONL.") from None


def load_model(model_dir: str, *, dtype: torch.dtype, device: str, allow_pickle: bool = False,
               trust_remote_code: bool = False):
    """``AutoModelForCausalLM.from_pretrained`` with the poslens attention, eval mode, on ``device``."""
    from transformers import AutoModelForCausalLM

    register()
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=dtype, attn_implementation=ATTN_NAME, use_safetensors=None if allow_pickle else True,
        trust_remote_code=trust_remote_code,
    )
    return model.to(device).eval()


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


def plan_scan(cfg: ScanConfig) -> ScanPlan:
    """Validate all inputs and build the sequence source; raises :class:`PoslensError`, writes nothing."""
    from transformers import AutoConfig

    from poslens.cli_app import parse_device
    from poslens.rundir import prepare_out_dir

    check_model_dir(cfg.model_dir, allow_pickle=cfg.allow_pickle, trust_remote_code=cfg.trust_remote_code)
    try:
        config = AutoConfig.from_pretrained(cfg.model_dir, trust_remote_code=cfg.trust_remote_code)
    except ValueError as e:
        raise PoslensError(f"{cfg.model_dir}/config.json: {str(e).splitlines()[0]}") from None
    adapter = get_adapter(config)
    L = adapter.num_layers(config)
    H = adapter.num_heads(config)
    maxpos = adapter.max_positions(config)
    if maxpos is not None and cfg.seq_len > maxpos:
        raise PoslensError(f"--seq-len {cfg.seq_len} exceeds the model's maximum of {maxpos} positions; "
                           f"pass --seq-len {maxpos} or less.")
    for flag, val in (("--batch-size", cfg.batch_size), ("--num-seqs", cfg.num_seqs), ("--seq-len", cfg.seq_len),
                      ("--checkpoint-every", cfg.checkpoint_every)):
        if val < 1:
            raise PoslensError(f"{flag} {val}: must be a positive integer.")
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
    dtype = resolve_dtype(cfg.dtype, device, config)
    prepare_out_dir(cfg.out, must_be_new=not cfg.resume)
    tokenizer = None
    if cfg.data != "random":
        tokenizer = load_tokenizer(cfg.model_dir, cfg.trust_remote_code)
    source = make_source(cfg.data, seq_len=cfg.seq_len, num_seqs=cfg.num_seqs, seed=cfg.seed, tokenizer=tokenizer,
                         vocab_size=getattr(config, "vocab_size", None))
    spec = CaptureSpec(num_layers=L, num_heads=H, num_kv_heads=adapter.num_kv_heads(config),
                       head_dim=adapter.head_dim(config), seq_len=cfg.seq_len, layers=layers, rope_layers=rope_layers,
                       heads=list(cfg.heads), no_rope_layers=set(cfg.no_rope_layers), bidirectional=cfg.bidirectional,
                       chunk_elems=cfg.chunk_elems)
    return ScanPlan(cfg, config, adapter, spec, source, device, dtype)


# --------------------------------------------------------------------------------------------
# capture wiring
# --------------------------------------------------------------------------------------------
def attach(model, adapter: Adapter, capture: Capture) -> list:
    """Forward hooks that feed the capture (only while it is active): rotary cos/sin and
    residual-stream vectors. Returns the hook handles (``h.remove()`` detaches)."""
    from poslens.capture import attention as _attn

    handles = []
    rot = adapter.rotary_module(model)
    if rot is not None:
        def _rope_hook(_m, _args, out):
            if _attn._ACTIVE is capture:
                capture.rope_cos_sin = (out[0], out[1])
        handles.append(rot.register_forward_hook(_rope_hook))
    layers = adapter.decoder_layers(model)
    first = 0  # layer 0's input is the embedding output (cosine/norms index 0)

    def _pre_hook(_m, args, kwargs):
        if _attn._ACTIVE is capture:
            capture.observe_hidden(0, args[0] if args else kwargs["hidden_states"])
    handles.append(layers[first].register_forward_pre_hook(_pre_hook, with_kwargs=True))
    for k, l in enumerate(capture.spec.layers):
        def _hook(_m, _args, out, index=k + 1):
            if _attn._ACTIVE is capture:
                capture.observe_hidden(index, out[0] if isinstance(out, (tuple, list)) else out)
        handles.append(layers[l].register_forward_hook(_hook))
    return handles


def fingerprint(cfg: ScanConfig) -> str:
    d = {k: getattr(cfg, k) for k in _FINGERPRINT_FIELDS}
    d["model_dir"] = str(Path(cfg.model_dir).resolve())
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_checkpoint(out: Path, capture: Capture, next_seq: int, fp: str) -> None:
    from poslens.rundir import write_tensors

    write_tensors(out / CHECKPOINT, capture.accs.state_dict(), metadata={"next_seq": next_seq, "fingerprint": fp})


def load_checkpoint(out: Path, capture: Capture, fp: str) -> int:
    """Load accumulators from ``out/checkpoint.safetensors``; returns the next sequence index (0 if none)."""
    path = out / CHECKPOINT
    if not path.exists():
        return 0
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    if json.loads(meta.get("fingerprint", "null")) != fp:
        raise PoslensError(f"--resume: {path} was written by a scan with different options; rerun with the "
                           "original options or choose a new --out.")
    from poslens.rundir import read_tensors

    capture.accs.load_state_dict(read_tensors(path))
    return int(json.loads(meta["next_seq"]))


# --------------------------------------------------------------------------------------------
# the scan
# --------------------------------------------------------------------------------------------
def run_scan(cfg: ScanConfig, progress: bool = True, *, stop_after_batches: int | None = None) -> dict:
    """Run (or resume) a scan and write its run directory; returns the summary dict.

    ``stop_after_batches`` ends the loop early after that many batches of this call, leaving a
    checkpoint as a killed run would (used by tests of resume).
    """
    from poslens.rundir import create_out_dir, versions, write_json

    t_start = time.time()
    plan = plan_scan(cfg)
    out = create_out_dir(Path(cfg.out))
    fp = fingerprint(cfg)
    capture = Capture(plan.spec, device=plan.device)
    start = load_checkpoint(out, capture, fp) if cfg.resume else 0
    write_json(out / "config.json", {"command": "scan", "options": dataclasses.asdict(cfg), "fingerprint": fp,
                                     "source": plan.source.describe(), "model_type": plan.adapter.model_type,
                                     "dtype": str(plan.dtype), "device": plan.device, "versions": versions()})
    model = load_model(cfg.model_dir, dtype=plan.dtype, device=plan.device, allow_pickle=cfg.allow_pickle,
                       trust_remote_code=cfg.trust_remote_code)
    handles = attach(model, plan.adapter, capture)
    N, Bsz = plan.source.num_seqs, cfg.batch_size
    batches = [(s, min(N, s + Bsz)) for s in range(0, N, Bsz)]
    todo = [b for b in batches if b[0] >= start]
    tokens = 0
    t_loop = time.time()
    try:
        with _progress(progress, len(batches), len(batches) - len(todo)) as advance:
            for n_done, (s, e) in enumerate(todo, 1):
                ids = plan.source.batch(s, e).to(plan.device)
                capture.begin_batch(e - s)
                with torch.no_grad(), capture.active():
                    model(input_ids=ids, use_cache=False)
                capture.end_batch()
                tokens += ids.numel()
                last = e == N
                if last or n_done % cfg.checkpoint_every == 0:
                    save_checkpoint(out, capture, e, fp)
                advance()
                if stop_after_batches is not None and n_done >= stop_after_batches and not last:
                    save_checkpoint(out, capture, e, fp)
                    return {"stopped_at": e}
    finally:
        for h in handles:
            h.remove()
    elapsed = time.time() - t_loop
    summary = finalize(out, capture, plan, figures=cfg.figures)
    summary["throughput"] = {"tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed if elapsed else None,
                             "wall_s": time.time() - t_start}
    write_json(out / "summary.json", summary)
    return summary


class _progress:
    def __init__(self, enabled: bool, total: int, done: int):
        self.enabled, self.total, self.done = enabled, total, done

    def __enter__(self):
        if not self.enabled:
            return lambda: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.p = Progress(TextColumn("scan"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        self.p.__enter__()
        self.task = self.p.add_task("scan", total=self.total, completed=self.done)
        return lambda: self.p.advance(self.task)

    def __exit__(self, *exc):
        if self.enabled:
            self.p.__exit__(*exc)
        return False


# --------------------------------------------------------------------------------------------
# outputs
# --------------------------------------------------------------------------------------------
def causal_view(m: torch.Tensor, include_diagonal: bool = True) -> torch.Tensor:
    """NaN above the diagonal (entries a causal query never sees)."""
    S = m.shape[-1]
    i = torch.arange(S)
    keep = i[:, None] >= i[None, :] if include_diagonal else i[:, None] > i[None, :]
    return torch.where(keep.to(m.device), m, torch.full_like(m, float("nan")))


def _subsample(m: torch.Tensor, k: int) -> torch.Tensor:
    S = m.shape[-1]
    if S <= k:
        return m
    idx = torch.linspace(0, S - 1, k).round().long()
    return m[..., idx, :][..., idx] if m.ndim >= 2 and m.shape[-2] == S else m[..., idx]


def _opt(x):
    return None if x is None else float(x)


def finalize(out: Path, capture: Capture, plan: ScanPlan, figures: bool = True) -> dict:
    """Write ``maps.safetensors`` (float32 means) and figures; return the summary dict."""
    from poslens.metrics import adjacency_probability_score, locality, norm_score, relativity_index
    from poslens.metrics.rank import band_contributions, rank_measures
    from poslens.metrics.slash import top_slash_heads
    from poslens.rundir import write_tensors

    cfg, spec, adapter, config = plan.cfg, plan.spec, plan.adapter, plan.config
    means = capture.means()
    n_seqs = capture.accs["scores"].count
    write_tensors(out / "maps.safetensors", {k: v.to(torch.float32) for k, v in means.items()},
                  metadata={"layers": spec.layers, "heads": [list(h) for h in spec.heads], "num_seqs": n_seqs,
                            "seq_len": spec.seq_len, "cosine_index": "0 = embeddings, k = output of layers[k-1]"})
    k = cfg.aps_max_positions
    rot_dim, base = adapter.rotary_dim(config), adapter.rope_base(config)
    layers = []
    for li, l in enumerate(spec.layers):
        sc = causal_view(means["scores"][li], include_diagonal=True)
        rm_q = rank_measures(means["q_gram"][li])
        rm_k = rank_measures(means["k_gram"][li])
        bands = band_contributions(means["dim_logit"][li], rot_dim if l in spec.rope_layers else None, base, spec.seq_len)
        layers.append({
            "layer": l,
            "rope": l in spec.rope_layers and l not in spec.no_rope_layers,
            "relativity_index": _opt(relativity_index(sc)),
            "locality": _opt(locality(_subsample(sc, k))),
            "aps": float(adjacency_probability_score(_subsample(means["cosine"][li + 1], k))),
            "attn_aps": float(adjacency_probability_score(_subsample(means["attn_cosine"][li], k))),
            "norm_score": float(norm_score(_subsample(means["norms"][li + 1], k))),
            "top_slash_heads": top_slash_heads(means["slash"][li: li + 1], k=3, layer_ids=[l]),
            "q_top1_energy": rm_q["top1_energy"].tolist(),
            "k_top1_energy": rm_k["top1_energy"].tolist(),
            "q_effective_rank": rm_q["effective_rank"].tolist(),
            "k_effective_rank": rm_k["effective_rank"].tolist(),
            "band_logit": {b: v.tolist() for b, v in bands.items()},
        })
    summary = {
        "model_dir": str(cfg.model_dir),
        "model_type": adapter.model_type,
        "num_seqs": n_seqs,
        "seq_len": spec.seq_len,
        "controls": {"no_rope_layers": sorted(spec.no_rope_layers), "bidirectional": spec.bidirectional},
        "embedding_aps": float(adjacency_probability_score(_subsample(means["cosine"][0], k))),
        "aps_positions": min(k, spec.seq_len),
        "layers": layers,
        "slash_top_heads": top_slash_heads(means["slash"], k=10, layer_ids=spec.layers),
        "slash_top_heads_offset_ge1": top_slash_heads(means["slash"], k=10, min_offset=1, layer_ids=spec.layers),
        "files": ["config.json", "maps.safetensors", "summary.json"],
    }
    if figures:
        summary["files"] += write_figures(out, means, spec)
    return summary


def write_figures(out: Path, means: dict, spec: CaptureSpec, max_per_figure: int = 8) -> list[str]:
    """Raw and diagonal-normalised score maps per layer (1-99 % colour range), in groups of 8 layers."""
    from poslens.metrics import diagonal_normalize
    from poslens.plots import layer_grid
    from poslens.rundir import save_figure

    files = []
    scores = causal_view(means["scores"])
    single = len(spec.layers) <= max_per_figure
    for g in range(0, len(spec.layers), max_per_figure):
        sel = list(range(g, min(len(spec.layers), g + max_per_figure)))
        ids = [spec.layers[i] for i in sel]
        titles = [f"layer {l}" for l in ids]
        prefix = "scores" if single else f"scores_layers{ids[0]}-{ids[-1]}"
        raw = layer_grid([scores[i] for i in sel], titles=titles, suptitle="mean pre-softmax scores",
                         percentile=(1, 99))
        save_figure(raw, out / f"{prefix}_raw.png")
        # per layer: diagonal_normalize on a stacked [n, S, S] NaN-masked map fails (see report)
        dn = [diagonal_normalize(scores[i]) for i in sel]
        fig = layer_grid(dn, titles=titles, suptitle="diagonal-normalised scores", percentile=(1, 99))
        save_figure(fig, out / f"{prefix}_diagnorm.png")
        files += [f"{prefix}_raw.png", f"{prefix}_diagnorm.png"]
    return files
