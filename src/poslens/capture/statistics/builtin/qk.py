"""``qk``: second moments of the pre-RoPE queries and keys (rank analysis), and the reservoir
sample of the same vectors.

``q_gram[l, h]`` / ``k_gram[l, g]``: the per-token second moment ``(1/S) sum_i x_i x_i^T`` of the
pre-RoPE queries (per query head) / keys (per key head), mean over sequences; its eigenvalues are
the squared singular values of the tokens x head_dim matrix, so rank measures are exact over every
token seen. Interleaved-RoPE models are read in the rotate-half pair layout. The ``--reservoir``
sample (:mod:`poslens.capture.statistics.reservoir`) belongs to this statistic.
"""

from __future__ import annotations

import torch

from poslens.capture.statistics.builtin.base import BuiltinStatistic, LayerBatch


def head_gram(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x[b,h]^T x[b,h]`` per sequence and head, float32 ``[B, H, D, D]`` (into ``out`` if given);
    the caller sums them over sequences in float64."""
    return torch.matmul(x.transpose(-1, -2), x, out=out)


class QKMoments(BuiltinStatistic):
    name = "qk"
    accumulators = ("q_gram", "k_gram")
    needs = frozenset({"qk"})

    def shapes(self, spec):
        L, H, Hk, D = len(spec.layers), spec.num_heads, spec.num_kv_heads, spec.head_dim
        return {"q_gram": (L, H, D, D), "k_gram": (L, Hk, D, D)}

    def add(self, batch: LayerBatch, piece) -> None:
        """Float32 ``[S, D] x [S, D]`` products per sequence and head, summed in float64; the
        reservoir's new rows.

        One sequence at a time: its RoPE inverse, products and reservoir rows stay cache-sized (at
        batch 20 a layer's q and k are 40 MiB each, and inverting them whole, then reading them again
        for the products, was memory traffic). The values are those of the whole-batch computation."""
        cap, q, k, li = batch.capture, batch.q, batch.k, batch.li
        spec, acc = cap.spec, cap.accs
        B, H, S, D = q.shape
        Hk = k.shape[1]
        # attention already sees un-rotated q/k under the --no-rope-layers control. The users'
        # statistics may have un-rotated the whole batch already (LayerBatch.pre_rope): the same
        # float32 values, taken as they are
        rope = batch.layer in spec.rope_layers and batch.layer not in spec.no_rope_layers
        pre = batch.pre_rope() if rope and batch.pre_rope_computed() else None
        perm = cap.half_perm(D, q.device) if spec.rope_layout == "interleaved" else None
        cpu = q.device.type == "cpu"
        qg = cap.work.buffer("q_gram", (B, H, D, D), q.device, reuse=cpu)
        kg = cap.work.buffer("k_gram", (B, Hk, D, D), q.device, reuse=cpu)
        res = cap.reservoir
        if res is not None:  # the tokens entering the reservoir: (sequence in the batch, position)
            sel_b, sel_s = res.new_slots()
            q_new = torch.empty(H, sel_b.numel(), D, dtype=torch.float32, device=q.device)
            k_new = torch.empty(Hk, sel_b.numel(), D, dtype=torch.float32, device=q.device)
        # on the CPU one sequence at a time (cache-sized); on a GPU the whole batch at once (a loop of
        # small kernels with a host sync per sequence for the reservoir costs more than the work)
        step = 1 if cpu else B
        for b in range(0, B, step):
            q_pre, k_pre = (q[b:b + step], k[b:b + step])
            if pre is not None:
                q_pre, k_pre = (t[b:b + step] for t in pre)
            elif rope:
                q_pre, k_pre = cap.unrotate(q_pre, k_pre, batch=b if step == 1 else None)
            if perm is not None:  # statistics in the rotate_half layout (pair l = dims l, l + r/2)
                q_pre, k_pre = (t.index_select(-1, perm) for t in (q_pre, k_pre))
            head_gram(q_pre, out=qg[b:b + step])
            head_gram(k_pre, out=kg[b:b + step])
            if res is None:
                continue
            if step == B:  # every selected token of the batch in one gather: [n, H, D] -> [H, n, D]
                q_new.copy_(q_pre[sel_b, :, sel_s].transpose(0, 1))
                k_new.copy_(k_pre[sel_b, :, sel_s].transpose(0, 1))
                continue
            mine = (sel_b == b).nonzero().squeeze(1)
            if mine.numel():
                pos = sel_s[mine]
                q_new[:, mine] = q_pre[0][:, pos].to(torch.float32)
                k_new[:, mine] = k_pre[0][:, pos].to(torch.float32)
        acc["q_gram"].sum[li] += qg.sum(0, dtype=torch.float64).div_(S)
        acc["k_gram"].sum[li] += kg.sum(0, dtype=torch.float64).div_(S)
        if res is not None:
            res.observe_new(li, q_new, k_new)


STATISTIC = QKMoments()
