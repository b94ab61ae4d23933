"""The parameter-free causal transformer of arXiv 2509.21042, as a streaming
Monte Carlo experiment.

One layer: ``X <- Softmax(Mask(Q K^T * s)) Y + X`` with ``Y = Norm(X)``, ``Q = K = RoPE(Y)`` (or
``Y`` without RoPE), values ``Y`` (unrotated), ``Norm`` = row-wise L2 (s = 1) or LayerNorm
without affine (s = 1/sqrt(d) or 1/d), ``Mask`` = causal or none.

Inputs have mean pairwise inner product alpha: ``x_i = normalize(m z_i + l c)`` with
``z_i, c ~ N(0, I_d)`` independent, ``l = sqrt(alpha / (1 - alpha))``, ``m = 1``.

Samples are drawn in fixed blocks of :data:`RNG_BLOCK` sequences, block ``b`` from its own
generator seeded by ``(seed, b)``: results depend on the seed and the number of samples only,
not on the compute chunk size, the device's batch size or the number of CPU workers (up to
float32 rounding for the chunk size; bit for bit for the workers). Per-layer sums of the scores,
their squares and the attention weights are accumulated in float64, so memory is bounded by one
chunk per worker and the result (``[L, S, S]``), never by the number of samples.

On CPU, chunks run on single-threaded workers, each with its work space allocated once
(:func:`layer_buffers`); their sums are folded in chunk order (see :func:`run_simulation`).

Noise: sample n also adds its score map to group ``n % G`` (:data:`poslens.capture.statistics.accumulators.NOISE_GROUPS`
groups); the spread of the group means is the noise floor of every statistic (entries of one
sample are correlated, e.g. through the shared input component at alpha > 0, so per-entry
standard errors alone cannot say whether a map is flat).

Layers count from 0 (the paper's layer 1 is our layer 0).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from poslens.capture.statistics.accumulators import AccumulatorSet, GroupAccumulator, MeanAccumulator, NOISE_GROUPS
from poslens.conventions import LAYER_CONVENTION
from poslens.errors import OptionError, PoslensError, require_fits
from poslens.metrics.diagonal import describe_map
from poslens.rope import apply_rope, cos_sin
from poslens.rundir.io import read_json, read_tensors, versions, write_json, write_tensors
from poslens.rundir.figures import save_figure
from poslens.rundir.staging import staged_dir
from poslens.rundir.summary import write_summary
from poslens.runtime import available_cpus, parse_device, set_threads
from poslens.theory import kim_mean_field

#: sequences drawn from one generator; fixes the sample stream independently of chunking.
RNG_BLOCK = 250


@dataclass
class SimConfig:
    alpha: float = 0.0
    layers: int = 4
    seq_len: int = 50
    dim: int = 64
    samples: int = 100_000
    norm: str = "l2"  # "l2" | "layernorm"
    scale: str | None = None  # "sqrt-d" | "d"; LayerNorm only (default sqrt-d there)
    rope: bool = False
    rope_theta: float = 10000.0
    causal: bool = True
    seed: int = 0
    device: str = "auto"  # auto (CUDA when visible) | cpu | cuda[:N]; resolved by poslens.runtime.parse_device
    chunk_size: int = 0  # sequences per compute chunk; 0 = automatic
    target_stderr: float | None = None

    def validate(self) -> "SimConfig":
        if not (0.0 <= self.alpha < 1.0) or not math.isfinite(self.alpha):
            raise PoslensError(f"--alpha {self.alpha}: must lie in [0, 1) (mean pairwise inner product of the inputs).")
        for name, flag in (("layers", "--num-layers"), ("seq_len", "--seq-len"), ("dim", "--dim"), ("samples", "--samples")):
            if int(getattr(self, name)) < 1:
                raise OptionError(flag, getattr(self, name), "must be a positive integer.")
            require_fits(flag, int(getattr(self, name)))
        if self.norm not in ("l2", "layernorm"):
            raise PoslensError(f"--norm {self.norm!r}: choose l2 or layernorm.")
        if self.norm == "l2" and self.scale is not None:
            raise PoslensError("--scale applies to --norm layernorm only (L2-normalised scores are unscaled cosines).")
        if self.scale is not None and self.scale not in ("sqrt-d", "d"):
            raise PoslensError(f"--scale {self.scale!r}: choose sqrt-d or d.")
        if self.rope and self.dim % 2:
            raise PoslensError(f"--dim {self.dim}: RoPE needs an even dimension.")
        if self.rope and not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise PoslensError(f"--rope-theta {self.rope_theta}: must be a positive finite number (e.g. 10000).")
        if self.chunk_size < 0:
            raise PoslensError(f"--chunk-size {self.chunk_size}: must be >= 0 (0 = automatic).")
        if self.target_stderr is not None and not (self.target_stderr > 0):
            raise PoslensError(f"--target-stderr {self.target_stderr}: must be positive.")
        return self

    @property
    def score_scale(self) -> float:
        if self.norm == "l2":
            return 1.0
        return 1.0 / (self.dim if self.scale == "d" else math.sqrt(self.dim))

    def label(self) -> str:
        parts = [f"alpha={self.alpha:g}", self.norm if self.norm == "l2" else f"LN/{self.scale or 'sqrt-d'}"]
        parts.append("RoPE" if self.rope else "NoPE")
        parts.append("causal" if self.causal else "non-causal")
        return ", ".join(parts)


def sample_inputs(cfg: SimConfig, block: int, device: str | torch.device = "cpu",
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """RNG block ``block``: ``[RNG_BLOCK, S, d]`` float32 unit vectors with mean inner product alpha.

    ``out`` (a contiguous float32 ``[RNG_BLOCK, S, d]`` tensor on ``device``) receives the block
    instead of a new tensor; the numbers are the same either way.
    """
    # Drawn on the device itself: on CUDA a host generator plus the copy bound the whole run (the
    # host's normal sampler is slower than the GPU's layers). Same seed, other stream on CUDA.
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(cfg.seed * 1_000_003 + block)
    z = torch.empty(RNG_BLOCK, cfg.seq_len, cfg.dim, device=dev) if out is None else out
    z.normal_(generator=g)  # the stream of torch.randn(..., generator=g)
    if cfg.alpha > 0:  # at alpha = 0 the shared component has weight 0: skip drawing it
        c = torch.randn(RNG_BLOCK, 1, cfg.dim, generator=g, device=dev)
        z.add_(c.mul_(math.sqrt(cfg.alpha / (1.0 - cfg.alpha))))
    return _l2_normalize(z, out=z)


def _l2_normalize(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``F.normalize(x, dim=-1)`` (same numbers), written into ``out`` (may be ``x``) without temporaries."""
    n = torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min_(1e-12)
    return torch.div(x, n, out=out) if out is not None else x / n


def _norm(x: torch.Tensor, cfg: SimConfig, out: torch.Tensor | None = None) -> torch.Tensor:
    if cfg.norm == "l2":
        return _l2_normalize(x, out)
    return F.layer_norm(x, (x.shape[-1],))


def forward_layers(x: torch.Tensor, cfg: SimConfig, rope_cs=None, neg_mask=None, buffers: dict | None = None):
    """Run all layers on ``x`` [B, S, d]; yields ``(scores, probs)`` per layer.

    ``neg_mask`` is an additive [S, S] mask (0 / -inf); it is fused into the score matmul, so the
    yielded scores hold -inf at masked entries (callers blank those). Q = K = RoPE(Y), values Y.

    ``buffers`` (from :func:`layer_buffers`) reuses preallocated tensors (no allocation at all with
    the L2 norm and no RoPE): ``x`` is then updated in place and every layer yields the same two
    ``[B, S, S]`` tensors, overwritten by the next layer (read them before asking for the next
    one). Without it ``x`` is left untouched.
    """
    scale = cfg.score_scale
    B = x.shape[0]
    if buffers is None:
        x = x.clone()
        y_buf = s_buf = p_buf = None
    else:
        y_buf, s_buf, p_buf = (buffers[k][:B] for k in ("y", "s", "p"))
    for _ in range(cfg.layers):
        y = _norm(x, cfg, out=y_buf)
        q = apply_rope(y, *rope_cs) if rope_cs is not None else y
        if neg_mask is not None:
            s = torch.baddbmm(neg_mask.expand(B, -1, -1), q, q.transpose(-1, -2), alpha=scale, out=s_buf)
        else:
            s = torch.bmm(q, q.transpose(-1, -2), out=s_buf)
            if scale != 1.0:
                s.mul_(scale)
        p = torch.softmax(s, dim=-1) if p_buf is None else torch._softmax(s, -1, False, out=p_buf)
        x.baddbmm_(p, y)  # residual: X + A Y (values unrotated)
        yield s, p


def layer_buffers(cfg: SimConfig, batch: int, device, dtype=torch.float32) -> dict:
    """Work space of :func:`forward_layers` for ``batch`` sequences: inputs ``x``, ``y`` [B, S, d];
    scores ``s``, weights ``p`` [B, S, S]."""
    S, d = cfg.seq_len, cfg.dim
    return {"x": torch.empty(batch, S, d, device=device, dtype=dtype),
            "y": torch.empty(batch, S, d, device=device, dtype=dtype),
            "s": torch.empty(batch, S, S, device=device, dtype=dtype),
            "p": torch.empty(batch, S, S, device=device, dtype=dtype)}


def _new_accumulators(cfg: SimConfig, device) -> AccumulatorSet:
    shape = (cfg.layers, cfg.seq_len, cfg.seq_len)
    return AccumulatorSet(scores=MeanAccumulator(shape, with_var=True, device=device),
                          probs=MeanAccumulator(shape, device=device),
                          score_groups=GroupAccumulator(NOISE_GROUPS, shape, device=device))


@dataclass
class SimResult:
    config: SimConfig
    scores: torch.Tensor  # [L, S, S] mean pre-softmax scores, NaN where masked
    scores_stderr: torch.Tensor
    probs: torch.Tensor
    samples: int
    seconds: float
    stopped_early: bool = False
    summary: dict = field(default_factory=dict)
    score_groups: torch.Tensor | None = None  # [G, L, S, S] group means (non-empty groups), NaN where masked
    group_counts: torch.Tensor | None = None  # [G] samples per group


def auto_chunk(cfg: SimConfig) -> int:
    """Sequences per chunk: ~4 MB per [B, S, S] float32 buffer (cache-friendly; measured fastest
    on CPU), at least one RNG block. On CUDA larger chunks keep the GPU busy."""
    per_seq = cfg.seq_len * max(cfg.seq_len, cfg.dim) * 4
    budget = 256e6 if str(cfg.device).startswith("cuda") else 4e6
    return max(1, int(budget // (per_seq * RNG_BLOCK))) * RNG_BLOCK


@dataclass
class _ChunkSums:
    """One chunk's float32 sums: per-group score sums ``[L, G, S, S]`` (group of sample n: n % G),
    score squares and weights ``[L, S, S]``, and the number of samples."""

    groups: torch.Tensor
    squares: torch.Tensor
    probs: torch.Tensor
    count: int


def _chunk_sums(cfg: SimConfig, first_block: int, n_blocks: int, first_sample: int, take: int,
                buffers: dict, rope_cs, neg_mask) -> _ChunkSums:
    """Draw RNG blocks ``first_block ..`` into the buffers, run the layers, return float32 sums."""
    S, L, G = cfg.seq_len, cfg.layers, NOISE_GROUPS
    dev = buffers["x"].device
    x = buffers["x"]
    for i in range(n_blocks):
        sample_inputs(cfg, first_block + i, dev, out=x[i * RNG_BLOCK:(i + 1) * RNG_BLOCK])
    x = x[:take]
    gid = torch.arange(first_sample, first_sample + take, device=dev) % G  # sample n -> group n % G
    groups = torch.zeros(L, G, S, S, device=dev)
    squares = torch.empty(L, S, S, device=dev)
    probs = torch.empty(L, S, S, device=dev)
    # Per-chunk sums in float32 (pairwise summation over <= a few thousand rows), folded into
    # float64 accumulators in chunk order: as accurate as float64 sums here and ~20x cheaper.
    for l, (s, p) in enumerate(forward_layers(x, cfg, rope_cs, neg_mask, buffers=buffers)):
        groups[l].index_add_(0, gid, s)
        torch.sum(p, 0, out=probs[l])
        torch.sum(s.square_(), 0, out=squares[l])  # s is spent: square it in place
    return _ChunkSums(groups, squares, probs, take)


def _fold(acc: AccumulatorSet, c: _ChunkSums, first_sample: int) -> None:
    G = acc["score_groups"].groups
    total = c.groups.to(torch.float64).sum(1)
    acc["scores"].add(total, c.count, c.squares)
    acc["probs"].add(c.probs, c.count)
    counts = [len(range(g, c.count, G)) for g in range(G)]  # rows i with (first + i) % G == group
    for j in range(G):
        if counts[j]:
            acc["score_groups"].add((first_sample + j) % G, c.groups[:, (first_sample + j) % G], counts[j])


def _workers(cfg: SimConfig, workers: int | None) -> int:
    if str(cfg.device).startswith("cuda"):
        return 1  # one stream: the GPU runs the chunks one after another anyway
    return max(1, int(workers)) if workers else available_cpus()


def memory_needed(cfg: SimConfig, chunk: int) -> int:
    """Bytes a simulation holds at least: the float64 accumulators (score sums and squares, weights,
    :data:`NOISE_GROUPS` group sums: ``[L, S, S]`` each), one chunk's float32 sums
    (``NOISE_GROUPS`` + 2 maps) and one worker's buffers (:func:`layer_buffers`)."""
    L, S, d = cfg.layers, cfg.seq_len, cfg.dim
    maps = L * S * S * ((3 + NOISE_GROUPS) * 8 + (NOISE_GROUPS + 2) * 4)
    return maps + chunk * (2 * S * d + 2 * S * S) * 4


def available_memory(device: torch.device) -> int | None:
    """Bytes free for a new allocation on ``device`` (CPU: the kernel's MemAvailable), or None
    where it cannot be told."""
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError):
            return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(cfg: SimConfig, chunk: int) -> None:
    """Refuse, before anything is allocated, a simulation whose maps cannot fit in memory."""
    need = memory_needed(cfg, chunk)
    free = available_memory(torch.device(cfg.device))
    if free is not None and need > free:
        L, S, d = cfg.layers, cfg.seq_len, cfg.dim
        maps = L * S * S * ((3 + NOISE_GROUPS) * 8 + (NOISE_GROUPS + 2) * 4)
        if maps >= need - maps:  # the [L, S, S] maps dominate
            what, fix = f"--seq-len {S} with {L} layer(s): the simulation's [L, S, S] maps", "--seq-len or --num-layers"
        else:  # the per-chunk buffers [chunk, S, d] dominate
            what, fix = f"--dim {d} at --seq-len {S}: the simulation's [samples, S, dim] buffers", "--dim or --chunk-size"
        raise PoslensError(f"{what} need about {fmt_bytes(need)}, more than the {fmt_bytes(free)} free on "
                           f"{cfg.device}; pass a smaller {fix}.")


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} TB"


def _chunk_jobs(cfg: SimConfig) -> tuple[int, list[tuple[int, int, int, int]]]:
    """Sequences per chunk (whole RNG blocks) and the chunks' jobs in sample order, each
    ``(first block, blocks, first sample, samples)``: the last chunk takes what is left."""
    chunk = cfg.chunk_size or auto_chunk(cfg)
    chunk = max(RNG_BLOCK, (chunk // RNG_BLOCK) * RNG_BLOCK)
    n_blocks = math.ceil(cfg.samples / RNG_BLOCK)
    per_chunk = chunk // RNG_BLOCK
    jobs = [(b, min(per_chunk, n_blocks - b), b * RNG_BLOCK, min(chunk, cfg.samples - b * RNG_BLOCK))
            for b in range(0, n_blocks, per_chunk)]
    return chunk, jobs


def _masks(cfg: SimConfig, dev: torch.device):
    """``(neg_mask, rope_cs, valid)``: the additive causal mask (None without the mask), RoPE's cos and
    sin (None without RoPE) and the entries whose standard error the early stop checks."""
    S = cfg.seq_len
    neg_mask = None
    if cfg.causal:
        neg_mask = torch.zeros(S, S, device=dev).masked_fill(torch.ones(S, S, dtype=torch.bool, device=dev).triu(1), float("-inf"))
    rope_cs = None
    if cfg.rope:
        rope_cs = tuple(t.to(dev) for t in cos_sin(torch.arange(S), cfg.dim, cfg.rope_theta))
    valid = torch.ones(S, S, dtype=torch.bool, device=dev).tril(-1) if cfg.causal else ~torch.eye(S, dtype=torch.bool, device=dev)
    return neg_mask, rope_cs, valid


@contextlib.contextmanager
def _chunk_sums_in_order(cfg: SimConfig, dev: torch.device, chunk: int, jobs: list, rope_cs, neg_mask,
                         n_workers: int):
    """Yields a generator of every job's :class:`_ChunkSums`, in job order, computed on ``n_workers``
    threads (each with its own buffers; torch single-threaded on CPU for the whole block). Closing
    the generator (an early stop) cancels the chunks not yet started."""
    local = threading.local()

    def job(spec):
        if not hasattr(local, "buffers"):
            local.buffers = layer_buffers(cfg, chunk, dev)
        return _chunk_sums(cfg, *spec, local.buffers, rope_cs, neg_mask)

    with contextlib.ExitStack() as stack:
        if dev.type == "cpu":
            stack.enter_context(set_threads(1))  # each worker single-threaded inside torch
        if n_workers > 1:
            pool = stack.enter_context(ThreadPoolExecutor(n_workers, thread_name_prefix="poslens-sim"))
            results = _ordered(pool, job, jobs, ahead=2 * n_workers)
        else:
            results = (job(spec) for spec in jobs)
        stack.callback(results.close)  # before the pool waits for its threads
        yield results


def run_simulation(cfg: SimConfig, progress: Callable[[int, int], None] | None = None,
                   workers: int | None = None) -> SimResult:
    """Stream ``cfg.samples`` sequences through the parameter-free model; returns mean maps.

    ``progress(done, total)`` is called after every chunk. With ``target_stderr`` the run stops
    after the first chunk at which every valid score entry's standard error is below it.

    On CPU the chunks run on ``workers`` threads (default: one per CPU this process may use), each
    single-threaded inside torch: no thread waits for another inside an operation, so a core busy
    with another process slows the run by its share only (:mod:`poslens.runtime`). Chunk sums are
    folded in chunk order: the result does not depend on the number of workers.
    """
    cfg = replace(cfg.validate(), device=parse_device(cfg.device))
    dev = torch.device(cfg.device)
    chunk, jobs = _chunk_jobs(cfg)
    check_memory(cfg, chunk)
    neg_mask, rope_cs, valid = _masks(cfg, dev)
    acc = _new_accumulators(cfg, dev)
    n_workers = min(_workers(cfg, workers), len(jobs))
    t0 = time.perf_counter()
    done = 0
    stopped = False
    with _chunk_sums_in_order(cfg, dev, chunk, jobs, rope_cs, neg_mask, n_workers) as results:
        for spec, sums in zip(jobs, results):
            _fold(acc, sums, spec[2])
            done += sums.count
            if progress:
                progress(done, cfg.samples)
            if cfg.target_stderr is not None and done >= 2 * RNG_BLOCK:
                if float(acc["scores"].stderr[:, valid].max()) < cfg.target_stderr:
                    stopped = done < cfg.samples
                    break
        results.close()
        seconds = time.perf_counter() - t0
        res = _result(cfg, acc, done, seconds, stopped)
        res.summary = summarize(res)  # still single-threaded: small tensors, no barrier to wait at
    return res


def _result(cfg: SimConfig, acc: AccumulatorSet, done: int, seconds: float, stopped: bool) -> SimResult:
    S = cfg.seq_len
    scores = acc["scores"].mean.cpu()
    stderr = acc["scores"].stderr.cpu()
    if cfg.causal:
        upper = torch.ones(S, S, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(upper, float("nan"))
        stderr = stderr.masked_fill(upper, float("nan"))
    groups, counts = acc["score_groups"].group_means()
    groups = groups.cpu()
    if cfg.causal:
        groups = groups.masked_fill(upper, float("nan"))
    res = SimResult(cfg, scores, stderr, acc["probs"].mean.cpu(), done, seconds, stopped,
                    score_groups=groups, group_counts=counts.cpu())
    return res


def _ordered(pool: ThreadPoolExecutor, fn, items, ahead: int):
    """``map(fn, items)`` on ``pool`` with at most ``ahead`` items in flight, results in order.
    Closing the generator cancels what has not started."""
    pending: deque = deque()
    it = iter(items)
    try:
        for item in it:
            pending.append(pool.submit(fn, item))
            if len(pending) >= ahead:
                break
        while pending:
            out = pending.popleft().result()
            for item in it:
                pending.append(pool.submit(fn, item))
                break
            yield out
    finally:
        for f in pending:
            f.cancel()




#: statistics reported as missing (null, with the reason under ``missing``) when the sample groups
#: give no noise floor: computed from one noisy map they would be numbers from noise
_NEEDS_NOISE_FLOOR = ("relativity_index", "locality", "diagonal_trend", "flat")


def summarize(res: SimResult) -> dict:
    """Per-layer numbers (:func:`poslens.metrics.diagonal.describe_map`: relativity index, locality,
    signed diagonal trend, within-diagonal RMS, with noise floors from the sample groups), per-entry
    standard error and the gap to the closed form."""
    cfg = res.config
    theory = None
    if cfg.norm == "l2" and not cfg.rope and cfg.causal:
        theory = kim_mean_field(cfg.alpha, cfg.seq_len, cfg.layers)
    lower = torch.ones(cfg.seq_len, cfg.seq_len, dtype=torch.bool).tril(-1)
    layers = []
    groups = res.score_groups
    for l in range(cfg.layers):
        m, se = res.scores[l], res.scores_stderr[l]
        stats = describe_map(m, None if groups is None else groups[:, l], res.group_counts)
        if "noise_groups" not in stats:  # no noise floor (fewer than two sample groups): no verdict from noise
            stats.update({k: None for k in _NEEDS_NOISE_FLOOR})
            stats["missing"] = {k: stats["noise"] for k in _NEEDS_NOISE_FLOOR}
        max_se = float(se[lower].max()) if cfg.seq_len > 1 else 0.0
        entry = {
            "layer": l,
            "paper_layer": l + 1,
            **stats,
            "max_stderr": max_se if max_se == max_se else None,  # NaN with one sample: no stderr
            "mean_score": float(m[lower].mean()) if cfg.seq_len > 1 else float(m[0, 0]),
        }
        if theory is not None:
            gap = (m - theory[l])[lower]
            entry["theory_max_abs_diff"] = float(gap.abs().max()) if gap.numel() else 0.0
        layers.append(entry)
    return {
        "experiment": "kim-simulation",
        "label": cfg.label(),
        "layer_convention": LAYER_CONVENTION,
        "samples": res.samples,
        "stopped_early": res.stopped_early,
        "seconds": res.seconds,
        "samples_per_second": res.samples / res.seconds if res.seconds > 0 else None,
        "layers": layers,
    }


def save_result(res: SimResult, out: Path, figures: bool = True) -> None:
    """Write the run-directory contract: config.json, maps.safetensors, summary.json, PNGs."""
    with staged_dir(out) as stage:
        _write_result(res, stage, figures)


def _write_result(res: SimResult, out: Path, figures: bool) -> None:
    write_json(out / "config.json", {"command": "simulate", **asdict(res.config), "versions": versions()})
    tensors = {"scores": res.scores.float(), "scores_stderr": res.scores_stderr.float(), "probs": res.probs.float()}
    if res.score_groups is not None:
        tensors["score_groups"] = res.score_groups.float()
        tensors["group_counts"] = res.group_counts.to(torch.int64)
    write_tensors(out / "maps.safetensors", tensors,
                  metadata={"samples": res.samples, "label": res.config.label(), "layers": "from 0",
                            "score_groups": "[G, L, S, S] means of independent sample groups (sample n in group n % G)"})
    if figures:
        from poslens.figures import layer_grid, score_map_figures

        files = score_map_figures(res.scores, out, label=res.config.label(), percentile=None)
        L = res.probs.shape[0]
        titles = [f"layer {l}" for l in range(L)]
        probs = res.probs.masked_fill(torch.ones_like(res.probs[0], dtype=torch.bool).triu(1), float("nan")) \
            if res.config.causal else res.probs
        save_figure(layer_grid([probs[l] for l in range(L)], titles=titles,
                               suptitle=f"{res.config.label()} attention weights (layers from 0)"), out / "probs.png")
        res.summary["figures"] = files + ["probs.png"]
    first = next((l.get("layer") for l in res.summary.get("layers") or []), 0)
    res.summary = write_summary(out, res.summary, command="simulate", paper="kim",
                                layers_describe="pre-softmax scores of each simulated attention layer",
                                convention=None if first == 0 else
                                "simulated attention layers counted from 1, as in arXiv 2509.21042 "
                                "(layer 1 = the first attention layer)")


def load_result(run_dir: str | Path) -> SimResult:
    """Load a simulate run directory back into a :class:`SimResult`."""
    run_dir = Path(run_dir)
    cfg_d = read_json(run_dir / "config.json")
    fields = {k: v for k, v in cfg_d.items() if k in SimConfig.__dataclass_fields__}
    t = read_tensors(run_dir / "maps.safetensors")
    summ = read_json(run_dir / "summary.json")
    return SimResult(SimConfig(**fields), t["scores"].double(), t["scores_stderr"].double(), t["probs"].double(),
                     summ["samples"], summ["seconds"], summ.get("stopped_early", False), summ,
                     score_groups=t["score_groups"].double() if "score_groups" in t else None,
                     group_counts=t.get("group_counts"))
