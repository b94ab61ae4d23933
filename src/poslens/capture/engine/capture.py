"""The capture of one scan: it takes each captured layer's attention call, runs the layer's attention
pass on the backend chosen for it (:mod:`poslens.capture.backends.choice`) and hands the intermediates to
the statistics that need them: the built-in ones (:mod:`poslens.capture.statistics.builtin`) and the users'
(:class:`poslens.Statistic`, :mod:`poslens.capture.statistics.users`). Every built-in sum is float64 and every
count is sequences (:class:`poslens.capture.statistics.accumulators.AccumulatorSet`).
"""

from __future__ import annotations

import contextlib
import weakref

import torch

from poslens import native as poslens_native
from poslens.capture.backends import choice as backends
from poslens.capture.backends.attnpass import AttentionPass, Layer
from poslens.capture.backends.blocks import BlockMaps
from poslens.capture.statistics.builtin import active_statistics
from poslens.capture.statistics.builtin.base import LayerBatch, Piece
from poslens.capture.statistics.points import CHUNKED, RESIDUAL_POINTS
from poslens.capture.engine.context import ACTIVE
from poslens.capture.backends.kernels import HALF, half_input_matmuls
from poslens.capture.statistics.reservoir import QKReservoir
from poslens.capture.backends.rope import half_layout_perm, unrotate_qk
from poslens.capture.engine.spec import CaptureSpec
from poslens.capture.statistics.accumulators import AccumulatorSet, GroupAccumulator, noise_grid
from poslens.capture.backends.sums import LayerMaps, Workspace
from poslens.capture.statistics.users import UserStatistics
from poslens.errors import PoslensError


class Capture:
    """The capture loop of one scan (see the module docstring)."""

    def __init__(self, spec: CaptureSpec, device="cpu"):
        backends.kernel_setting()  # a bad POSLENS_CAPTURE_KERNEL is refused before anything runs
        self.spec = spec
        self.layer_pos = {l: n for n, l in enumerate(spec.layers)}
        self.head_pos: dict = {}
        for n, (l, h) in enumerate(spec.heads):
            self.head_pos.setdefault(l, []).append((n, h))
        self.builtins = active_statistics(spec)
        self._pass_stats = [st for st in self.builtins if st.needs & CHUNKED]
        self._qk_stats = [st for st in self.builtins if "qk" in st.needs]
        self._hidden_stats = [st for st in self.builtins if st.needs & set(RESIDUAL_POINTS)]
        self._output_stats = [st for st in self.builtins if "head_out" in st.needs]
        self.accs = AccumulatorSet()
        for st in self.builtins:
            self.accs.update(st.make_accumulators(spec, device))
        self.grid = noise_grid(spec.seq_len, spec.noise_max_positions).to(device)
        self.blocks = BlockMaps(spec.seq_len, spec.map_size) if spec.map_size else None
        self.work = Workspace()  # reused chunk workspaces and the C kernels' threads
        self.workers = self.work.workers
        self._native = None  # the fused CPU pass, made at first use
        self.rope_cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None
        #: per layer, the (cos, sin) its attention module received (Gemma 3: one table per layer type)
        self.rope_by_layer: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.seen_layers: set = set()  # layers whose attention reached the registered function
        self.windows: dict = {}  # sliding window each layer asked for (None = full)
        self.scalings: dict = {}  # logit scale each layer used
        #: the backend each layer's attention pass took, and why: {layer: (backend, reason)}
        self.backends: dict[int, tuple[str, str]] = {}
        self._batch_size = self._next_seq = self._seq0 = 0
        self._modules: weakref.WeakSet | None = None  # the attention modules it captures (None: any)
        self.sequences = 0  # sequences counted in (every accumulator's count)
        self.users = UserStatistics(spec.user_stats)
        self.user = self.users.stats
        self.reservoir = None
        if spec.reservoir and "qk" in spec.stats:  # the sample of pre-RoPE q/k vectors belongs to the qk statistic
            self.reservoir = QKReservoir(spec.reservoir, len(spec.layers), spec.num_heads, spec.num_kv_heads,
                                         spec.head_dim, spec.seq_len, seed=spec.seed, device=device)

    def restart(self, user_stats: tuple = ()) -> None:
        """Empty every sum and count and take ``user_stats`` as the users' statistics from here: the next
        sequences are a capture of their own, with the workspaces, the C kernels' threads and the bound
        modules kept (``poslens compare`` captures each sequence group so)."""
        import dataclasses

        for acc in self.accs.values():
            acc.sum.zero_()
            if isinstance(acc, GroupAccumulator):
                acc.counts.zero_()
            else:
                acc.count = 0
        self.sequences = 0
        self._batch_size = self._next_seq = self._seq0 = 0
        self.spec = dataclasses.replace(self.spec, user_stats=tuple(user_stats))
        self.users = UserStatistics(self.spec.user_stats)
        self.user = self.users.stats

    # -- context ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def active(self):
        """Route the registered attention function's calls into this object, in this context only
        (this thread or task; from the modules it is bound to, :meth:`bind`)."""
        token = ACTIVE.set(ACTIVE.get() + (self,))
        try:
            yield self
        finally:
            ACTIVE.reset(token)

    def is_active(self) -> bool:
        """Whether this capture is active in the current context (the capture points' hooks ask)."""
        return any(c is self for c in ACTIVE.get())

    def bind(self, modules) -> None:
        """Take attention calls from these modules only (weak references: the capture keeps no model alive)."""
        self._modules = weakref.WeakSet(modules)

    def owns(self, module) -> bool:
        """Whether an attention call from ``module`` belongs to this capture."""
        return self._modules is None or module is None or module in self._modules

    def begin_batch(self, batch_size: int, seq_start: int | None = None) -> None:
        """Start a batch of ``batch_size`` sequences; ``seq_start`` is the global index of its first
        sequence (default: right after the previous batch), which fixes the reservoir's slot keys and
        the noise groups (sequence n in group ``n % noise_groups``)."""
        self._batch_size = int(batch_size)
        self.users.begin_batch()
        self._seq0 = self._next_seq if seq_start is None else int(seq_start)
        self._next_seq = self._seq0 + self._batch_size
        if self.reservoir is not None:
            self.reservoir.begin_batch(self._seq0, self._batch_size)

    def end_batch(self) -> None:
        """Count the batch's sequences once in every accumulator (sums were added per layer)."""
        if self.users and self.seen_layers & set(self.layer_pos):
            self.users.check_fed(self.spec.layers)
        self.sequences += self._batch_size
        for acc in self.accs.values():
            if isinstance(acc, GroupAccumulator):
                acc.counts += torch.bincount(self.seq_groups("cpu"), minlength=acc.groups)
            else:
                acc.count += self._batch_size
        self._batch_size = 0
        if self.reservoir is not None:
            self.reservoir.end_batch()

    def seq_groups(self, device) -> torch.Tensor:
        """Noise group of each sequence of the current batch: ``(seq_start + b) % noise_groups``."""
        return (torch.arange(self._batch_size, device=device) + self._seq0) % self.spec.noise_groups

    # -- RoPE -------------------------------------------------------------------------------
    def enter_layer(self, layer, query, key, sliding_window, scaling):
        """Note what a layer's attention call brings (its window and logit scale), make its cos/sin
        current, and apply the no-RoPE control: returns the queries and keys the layer attends with."""
        self.seen_layers.add(layer)
        self.windows[layer] = int(sliding_window) if sliding_window else None
        self.scalings[layer] = float(scaling)
        self.use_layer_rope(layer)
        if layer in self.spec.no_rope_layers and layer in self.spec.rope_layers:  # inference-time control
            return self.unrotate(query, key)
        return query, key

    def use_layer_rope(self, layer) -> None:
        """Make the cos/sin that ``layer``'s attention received the current ones (for :meth:`unrotate`)."""
        cs = self.rope_by_layer.get(layer)
        if cs is not None:
            self.rope_cos_sin = cs

    def unrotate(self, query: torch.Tensor, key: torch.Tensor, batch: int | None = None):
        """Pre-RoPE queries and keys from post-RoPE ones with the model's own cos/sin, in the model's
        pair layout. ``batch``: ``query``/``key`` hold that one sequence of the batch (``[1, H, S, D]``)."""
        if self.rope_cos_sin is None:
            raise PoslensError("no RoPE cos/sin were observed for this forward; the adapter's rotary module hook "
                               "did not fire (unsupported architecture?).")
        cos, sin = self.rope_cos_sin
        if batch is not None and cos.shape[0] > 1:
            cos, sin = cos[batch:batch + 1], sin[batch:batch + 1]
        return unrotate_qk(query, key, cos, sin, layout=self.spec.rope_layout, workers=self.workers)

    def half_perm(self, D: int, device) -> torch.Tensor:
        """The dimension order taking interleaved RoPE pairs to the rotate-half layout."""
        rot = self.rope_cos_sin[0].shape[-1] if self.rope_cos_sin is not None else D
        return half_layout_perm(D, rot, device)

    # -- the residual stream and the users' points around a layer ------------------------------
    def reads_hidden(self) -> bool:
        """Whether a built-in statistic reads the residual stream (the capture loop hooks it then)."""
        return bool(self._hidden_stats)

    def residual_points(self) -> list[str]:
        """The residual-stream points the users' statistics read (hooked on every captured layer)."""
        return [p for p in RESIDUAL_POINTS if p in self.users.points]

    @torch.no_grad()
    def observe_hidden(self, index: int, hidden: torch.Tensor) -> None:
        """Residual-stream vectors ``[B, S, d]`` at index ``index`` (0: the embeddings, ``m + 1``: the
        output of captured layer ``m``) for the built-in statistics that read them."""
        for st in self._hidden_stats:
            st.add_hidden(self, index, hidden)

    def observe_point(self, layer: int, point: str, x: torch.Tensor) -> None:
        """A residual-stream point of a captured layer, for the users' statistics."""
        if layer in self.layer_pos:
            self.users.layer(layer, {point: x})

    # -- attention --------------------------------------------------------------------------
    def _pass_stats_at(self, layer) -> list:
        return [st for st in self._pass_stats if st.reads_at(self, layer)]

    def _needs_at(self, layer) -> frozenset:
        """The chunk intermediates the statistics of ``layer`` need."""
        return frozenset().union(*(st.needs & CHUNKED for st in self._pass_stats_at(layer)), self.users.pass_needs())

    def computes_output(self, layer, query, key, window, softcap, *, sink_off: bool = False) -> bool:
        """Whether :meth:`observe_attention` computes ``layer``'s output itself from the weights its
        statistics need anyway (on the CPU, ``spec.own_output``; not from the Triton kernels, which
        form no weights), so the model skips its SDPA pass."""
        if not self.spec.own_output or query.is_cuda or layer not in self.layer_pos:
            return False
        needs = self._needs_at(layer)
        return bool(needs) and backends.choose(query, key, needs, window=window, softcap=softcap,
                                               sink_off=sink_off)[0] != backends.TRITON

    @torch.no_grad()
    def observe_attention(self, layer, query, key, out, scaling, *, causal=True, window=None,
                          softcap=None, value=None, sink_off=False):
        """Add one layer's statistics for a batch. ``out``: the layer's attention output ``[B, H, S, D]``;
        pass ``out=None`` and the ``value`` states instead (when :meth:`computes_output`) to have it
        computed from the pass's own weights. ``sink_off``: key 0 is masked for the queries after it
        (an intervention, :mod:`poslens.capture.engine.intervene`). Returns the output ``[B, H, S, D]``."""
        batch = LayerBatch(self, layer, self.layer_pos[layer], None, None, float(scaling), causal, window,
                           softcap=softcap, query=query, key=key, heads=self.head_pos.get(layer, []),
                           sink_off=sink_off)
        stats, needs = self._pass_stats_at(layer), self._needs_at(layer)
        if out is None and not (value is not None and needs and not query.is_cuda):
            raise ValueError("observe_attention: pass the layer output, or the values where computes_output()")
        backend, why = backends.choose(query, key, needs, window=window, softcap=softcap,
                                       sink_off=sink_off) if needs else (None, "")
        if backend is not None:
            self.backends[layer] = (backend, why)
        if self._qk_stats or (needs and backend != backends.TRITON):
            # contiguous once: transformers hands [B, S, H, D] projections transposed to [B, H, S, D],
            # whose (batch, head) strides do not merge, so every chunk's batched matmul would copy them
            batch.q, batch.k = self.work.f32("q", query), self.work.f32("k", key)
        points = self._user_qk_points(batch)
        whole = Piece(slice(0, query.shape[2]), slice(0, query.shape[0]), key.shape[2], {})
        for st in self._qk_stats:
            st.add(batch, whole)
        if needs:  # the logits are products of the model's own half values: exact in TF32
            with half_input_matmuls(query.is_cuda and query.dtype in HALF):
                out = self._attention(batch, stats, needs, backend, value, out, points)
        for st in self._output_stats:
            st.add(batch, Piece(whole.rows, whole.seqs, whole.keys, {"head_out": out.transpose(1, 2)}))
        if self.users:
            self.users.layer(layer, dict(points, head_out=out.transpose(1, 2)) if "head_out" in self.users.points
                             else points)
        return out

    def _user_qk_points(self, batch: LayerBatch) -> dict:
        """The q/k points the users' statistics need, computed once per layer for all of them (the
        pre-RoPE ones from :meth:`LayerBatch.pre_rope`, shared with the built-in statistics)."""
        need, pts = self.users.points, {}
        if "q_post" in need:
            pts["q_post"] = batch.query
        if "k_post" in need:
            pts["k_post"] = batch.key
        if need & {"q_pre", "k_pre"}:  # in the model's dtype, as it would have computed them
            pts["q_pre"], pts["k_pre"] = (t.to(batch.query.dtype) for t in batch.pre_rope())
        return pts

    def _attention(self, batch: LayerBatch, stats, needs, backend, value, out, points):
        """The layer's attention pass: its statistics' float32 sums filled, added to the accumulators,
        and the output (computed from the pass's own weights when ``out`` is None)."""
        query, key = batch.query, batch.key
        maps = batch.maps = LayerMaps(self.work, self.blocks, query.shape[2], query.device)
        for st in stats:
            st.begin_layer(batch, maps)
        held = {"out": None if out is None else out.transpose(1, 2)}
        readers = [(st.needs & CHUNKED, lambda piece, st=st: st.add(batch, piece)) for st in stats]
        readers += self.users.readers(batch, points, lambda: held["out"])
        done = False
        if backend == backends.TRITON:
            piece = backends.triton_pass(query, key, batch.scaling, batch.causal, [h for _, h in batch.heads], needs)
            if piece is not None:
                for st in stats:
                    st.add(batch, piece)
                done = True
            else:  # non-finite values somewhere: the checked torch pass names the head (or masks them)
                batch.q, batch.k = query.to(torch.float32).contiguous(), key.to(torch.float32).contiguous()
        if not done:
            v = self.work.f32("v", value) if out is None else None
            checked = not query.is_cuda or bool(self.users.pass_needs())
            p = self._chunked(batch, readers, v, held, checked=checked, native=backend == backends.NATIVE)
            if p is None and self.users.pass_needs():  # the users' chunks before it were handed over already
                raise PoslensError(f"non-finite attention scores in layer {batch.layer} (model overflow?); try --dtype "
                                   "fp32 or check the checkpoint.")
            if p is None:  # a non-finite value the fast pass could not name: redo it checked
                for st in stats:
                    st.begin_layer(batch, maps)
                p = self._chunked(batch, readers, v, held, checked=True, native=False)
            if v is not None:
                out = p.output.transpose(1, 2)  # [B, H, S, D] view of [B, S, H, D]
        maps.finish(batch.causal, batch.window)
        for st in stats:
            st.end_layer(batch, maps)
        batch.maps = None
        return out

    def _chunked(self, batch: LayerBatch, readers, v, held: dict, *, checked: bool, native: bool):
        """One chunked pass (torch or native) of the layer; None when it met a non-finite value it did
        not name. ``held["out"]``: the layer output ``[B, S, H, D]`` the users' chunks read."""
        q, k = batch.half_layout()  # the logits are the same in either pair layout
        B, H, S, D = q.shape
        Hk = k.shape[1]
        g = H // Hk
        rows = backends.rows_per_chunk(B, H, S, q.device, g, self.spec.chunk_elems)
        bs = backends.sequences_per_slice(B, H, S, rows, q.device, self.spec.chunk_elems)
        # GQA without repeating keys: query head h = kv * g + r uses key head kv (a grouped view of q).
        # The keys transposed once per layer on the CPU: MKL runs the chunks' [c, D] x [D, nc] products
        # about 1.5x faster from a [D, S] matrix than from a transposed view of [S, D]
        kT = self.work.buffer("kT", (B, Hk, D, S), q.device).copy_(k.transpose(2, 3)) if q.device.type == "cpu" \
            else k.transpose(2, 3)
        layer = Layer(batch.layer, q.view(B, Hk, g, S, D), kT, batch.scaling, batch.causal, batch.window,
                      batch.softcap, [h for _, h in batch.heads], rows, bs, v=v, out_dtype=batch.query.dtype,
                      sink_off=batch.sink_off)
        if native and self._native is None:
            self._native = poslens_native.SoftmaxSums(self.workers)
        p = AttentionPass(layer, readers, self.work, checked=checked, native=self._native if native else None)
        if p.output is not None:  # computed chunk by chunk: the users' head_out rows come from it
            held["out"] = p.output
        return p if p.run() else None

    # the sums: state (checkpoints), all-reduce across ranks, means
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every accumulated tensor (sums, counts, reservoir, the users' statistics' tensors under
        ``user.<i>.<n>``): what a checkpoint holds, with :meth:`state_metadata` beside it."""
        out = self.accs.state_dict()
        out["capture.sequences"] = torch.tensor([self.sequences], dtype=torch.int64, device="cpu")
        if self.reservoir is not None:
            out.update(self.reservoir.state_dict())
        out.update(self.users.state_dict())
        return out

    def state_metadata(self) -> dict:
        """What a checkpoint stores beside the tensors: the users' statistics' classes and state trees."""
        return self.users.state_metadata()

    def load_state_dict(self, state, *, copy: bool = True, metadata: dict | None = None) -> None:
        """Load a :meth:`state_dict` (and its :meth:`state_metadata`); ``copy=False`` adopts the tensors."""
        self.accs.load_state_dict(state, copy=copy)
        first = next(iter(self.accs.values()), None)
        self.sequences = int(state["capture.sequences"][0]) if "capture.sequences" in state else \
            (first.count if first is not None else 0)
        if self.reservoir is not None:
            if "reservoir.keys" not in state:
                raise PoslensError("the checkpoint has no q/k reservoir; resume with the original --reservoir.")
            self.reservoir.load_state_dict(state)
        self.users.load_state_dict(state, copy=copy, metadata=metadata)

    def all_reduce(self, group=None) -> None:
        """Sum the accumulators and merge the reservoirs and users' statistics of all processes."""
        import torch.distributed as dist

        self.accs.all_reduce(group)
        n = torch.tensor([float(self.sequences)], dtype=torch.float64,
                         device="cuda" if dist.get_backend(group) == "nccl" else "cpu")
        dist.all_reduce(n, group=group)
        self.sequences = int(n.item())
        if self.reservoir is not None:
            self.reservoir.all_gather_merge(group)
        self.users.all_reduce(group)

    def user_results(self, taken=()) -> dict[str, torch.Tensor]:
        """The users' statistics' named result tensors (on the CPU)."""
        return self.users.results(taken)

    def means(self) -> dict[str, torch.Tensor]:
        """Mean of every accumulator (float64); upper triangles of causal maps are left as computed."""
        return {name: acc.mean for name, acc in self.accs.items()}

    def release_means(self, dtype=torch.float32, group_means: dict | None = None) -> dict[str, torch.Tensor]:
        """Means in ``dtype``, converting and freeing the float64 sums one by one (peak memory stays at
        the sums' size). ``group_means``: a group accumulator's ``group_means()`` by name, where the
        caller has them already. The accumulators are empty afterwards: call this last."""
        out = {}
        for name, acc in self.accs.items():
            if isinstance(acc, GroupAccumulator):  # group means of the non-empty groups, and their counts
                out[name], counts = (group_means or {}).get(name) or acc.group_means()
                out[name] = out[name].to(dtype)
                out[name.replace("groups", "group_counts")] = counts.to(torch.int64)
                continue
            out[name] = acc.release_mean(dtype)
        return out
