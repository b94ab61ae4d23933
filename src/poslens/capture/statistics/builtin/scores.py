"""``scores``: the mean attention-score map, and its noise groups.

``scores[l, i, j]``: the mean over heads of ``scaling * q_i . k_j`` (post-RoPE, GQA keys shared by
their query heads, soft-capped where the model caps), mean over sequences; 0 where a query does not
see the key (above the diagonal in causal runs, outside a sliding window: never computed).

``score_groups[g, l]``: the same sums taken separately over the sequence groups ``g = sequence % G``
on the :func:`~poslens.capture.statistics.accumulators.noise_grid` positions; the spread of the groups is the noise
floor of the score-map statistics.
"""

from __future__ import annotations

import torch

from poslens.capture.statistics.builtin.base import BuiltinStatistic, LayerBatch
from poslens.capture.statistics.accumulators import GroupAccumulator, noise_grid


class Scores(BuiltinStatistic):
    name = "scores"
    accumulators = ("scores", "score_groups")
    needs = frozenset({"logit_sum"})

    def shapes(self, spec):
        M = spec.map_side()
        return {"scores": (len(spec.layers), M, M)}

    def make_accumulators(self, spec, device):
        accs = super().make_accumulators(spec, device)
        n = noise_grid(spec.seq_len, spec.noise_max_positions).numel()
        accs["score_groups"] = GroupAccumulator(spec.noise_groups, (len(spec.layers), n, n), device=device)
        return accs

    def begin_layer(self, batch, maps):
        maps.zeros("scores", maps.M, maps.M)

    def add(self, batch, piece):
        batch.maps.put("scores", piece["logit_sum"], piece.rows.start)

    def end_layer(self, batch: LayerBatch, maps):
        cap, H = batch.capture, batch.query.shape[1]
        cap.work.add64(cap.accs["scores"].sum[batch.li], maps["scores"], alpha=1.0 / H, lower=batch.causal)
        self._add_groups(batch)

    @staticmethod
    def _add_groups(batch: LayerBatch) -> None:
        """Head-summed scores of each sequence on the noise grid, added to its sequence group.

        Only grid rows and keys are computed (``[B, H, n, n]``, n <= ``noise_max_positions``): a
        small product beside the full maps, whichever backend computed those. Above the diagonal stays
        0 (as in ``scores``); entries outside a sliding window are masked when the summary reads them.
        """
        cap, query, key = batch.capture, batch.query, batch.key
        B, H, _, D = query.shape
        Hk = key.shape[1]
        grid = cap.grid.to(query.device)
        n = grid.numel()
        qg = query[:, :, grid].to(torch.float32)
        kg = key[:, :, grid].to(torch.float32)
        if batch.softcap is None:
            # sum_h q_h . k_kv(h) = sum_kv (sum of its query heads' q) . k_kv: one product over the key
            # heads' concatenated dimensions, [B, n, Hk * D] x [B, Hk * D, n]
            qs = qg.reshape(B, Hk, H // Hk, n, D).sum(2)
            part = torch.bmm(qs.permute(0, 2, 1, 3).reshape(B, n, Hk * D),
                             kg.permute(0, 1, 3, 2).reshape(B, Hk * D, n)).mul_(batch.scaling)
        else:  # Gemma 2 caps each head's logits: the heads one by one
            if Hk != H:
                kg = kg.repeat_interleave(H // Hk, dim=1)
            logits = torch.matmul(qg, kg.transpose(-1, -2)).mul_(batch.scaling)  # [B, H, n, n]
            part = torch.tanh_(logits.div_(batch.softcap)).mul_(batch.softcap).sum(dim=1)
        if batch.causal:
            part.masked_fill_(grid[None, :] > grid[:, None], 0.0)
        part = torch.nan_to_num(part, nan=0.0, posinf=0.0, neginf=0.0).to(torch.float64).div_(H)
        acc = cap.accs["score_groups"]
        acc.sum[:, batch.li].index_add_(0, cap.seq_groups(acc.sum.device), part.to(acc.sum.device))


STATISTIC = Scores()
