"""Per-token losses and their paired statistics: a condition against the unmodified model on the same tokens."""

from __future__ import annotations

import math

import torch

from poslens.capture.engine.intervene import Intervention
from poslens.conventions import NOISE_P


# --------------------------------------------------------------------------------------------
# statistics (pure functions)
# --------------------------------------------------------------------------------------------
def token_losses(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``[B, S - 1]`` float32: the cross-entropy of token ``t`` given the tokens before it, from the
    logits ``[B, S, V]`` (upcast to float32, as transformers' causal-LM loss does)."""
    B, S, V = logits.shape
    target = torch.full((B, S), -100, dtype=torch.long, device=ids.device)  # the last position predicts nothing
    target[:, :-1] = ids[:, 1:]
    # on the whole contiguous [B * S, V] block: no copy of the logits (the last row is ignored, loss 0)
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, V), target.view(-1), reduction="none")
    return loss.view(B, S)[:, :-1]


#: the loss is computed from the final hidden states this many logits at a time (positions x vocabulary,
#: 128 MB in float32): no ``[B, S, V]`` logits block, whose size the heap kept under the CLI's allocator
#: settings (``poslens ablate`` at 8 x 64 tokens on SmolLM2 peaked at 7.0 GB, a scan of the same shape at
#: 1.3 GB). Smaller blocks read the LM head's weights once per block and give each product fewer rows: the
#: loss of 4 x 256 tokens on SmolLM2 (the head and the loss together) took 1.44x the CPU time of the head
#: alone at 2**23 logits on two threads, 1.27x at 2**24 and 1.17x at 2**25 (one thread: 1.09x, 1.07x, 1.03x).
LOSS_BLOCK_LOGITS = 2**25


def blocked_token_losses(head, hidden: torch.Tensor, ids: torch.Tensor, vocab: int,
                         block: int = LOSS_BLOCK_LOGITS, softcap: float | None = None) -> torch.Tensor:
    """:func:`token_losses` of the logits ``head(hidden)`` (``hidden [B, S, d]``: the final hidden states
    the LM head reads; ``vocab`` logits per position), a block of positions at a time: at most ``block``
    logits at once, one pass of the LM head over every position but the last (which predicts nothing).

    Each block's loss is ``logsumexp(z) - z[target]``, formed in place in the block's logits: a float32
    ``nn.Linear`` head writes them into one buffer reused by every block (no temporary as large as the
    block: the loss costs the head's pass and three reads of its output). ``softcap``: the model's final
    logit soft cap, ``cap * tanh(z / cap)``, applied to the logits first."""
    B, S, _ = hidden.shape
    h = hidden[:, :-1].reshape(B * (S - 1), -1)
    target = ids[:, 1:].reshape(-1, 1).to(hidden.device)
    out = torch.empty(B * (S - 1), dtype=torch.float32, device=hidden.device)
    rows = max(1, min(h.shape[0], block // max(1, vocab)))
    weight = getattr(head, "weight", None)
    into = (type(head) is torch.nn.Linear and weight.dtype == torch.float32 == h.dtype
            and weight.device == h.device)  # the product written into the buffer
    buf = torch.empty(rows, vocab, dtype=torch.float32, device=hidden.device) if into else None
    with torch.no_grad():
        for lo in range(0, h.shape[0], rows):
            hi = min(h.shape[0], lo + rows)
            if into:
                z = buf[:hi - lo]
                if head.bias is None:
                    torch.mm(h[lo:hi], weight.t(), out=z)
                else:
                    torch.addmm(head.bias, h[lo:hi], weight.t(), out=z)
            else:
                z = head(h[lo:hi]).float()
            if softcap:
                z.div_(softcap).tanh_().mul_(softcap)
            picked = z.gather(1, target[lo:hi])[:, 0]
            top = z.amax(1, keepdim=True)
            out[lo:hi] = z.sub_(top).exp_().sum(1).log_().add_(top[:, 0]).sub_(picked)
            del z
    return out.view(B, S - 1)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


#: positions of the first sequence whose logits, as the model gives them, the first forward compares with
#: the blocked losses (:class:`LossHead`): a change the model makes to its logits after the head (a soft cap)
#: shows on every position
CHECK_POSITIONS = 64


class LossHead:
    """The loss without the ``[B, S, V]`` logits: while :meth:`forward` runs, a forward pre-hook on the
    LM head keeps the final hidden states and hands the head no position (a hook cannot skip a module);
    the per-token losses are then computed from them a block of positions at a time
    (:func:`blocked_token_losses`). The first forward (``check=True``) hands the head the first
    :data:`CHECK_POSITIONS` positions of the first sequence instead and compares the losses of the logits
    the model gives there with the blocked ones: the blocked losses are used only where they are equal,
    float rounding aside (logits the model changes after its head, such as a soft cap, fail it; the
    model's whole logits are used from then on, that batch's forward run again with them)."""

    def __init__(self, model):
        self.model = model
        self.head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        self.vocab = int(getattr(self.head, "out_features", 0) or 0)
        self.ok = self.head is not None and self.vocab > 0
        self.hidden = None
        self._shown = 0  # positions of the first sequence the head is handed in the checked forward

    def _keep(self, _m, args):
        self.hidden = args[0]
        return (args[0][:, :0],)

    def _look(self, _m, args):
        self.hidden = args[0]
        return (args[0][:1, :self._shown],)

    def forward(self, x, check: bool = False) -> torch.Tensor:
        """The per-token losses ``[B, S - 1]`` (float32, on the CPU) of one forward of ``x``."""
        if not self.ok:
            return token_losses(_logits(self.model, x), x).cpu()
        self._shown = min(CHECK_POSITIONS, x.shape[1] - 1) + 1
        h = self.head.register_forward_pre_hook(self._look if check else self._keep)
        try:
            logits = _logits(self.model, x)
        except (RuntimeError, ValueError, IndexError):  # a model that cannot take logits of a few positions
            if not check:
                raise
            logits = None
        finally:
            h.remove()
        hidden, self.hidden = self.hidden, None
        if not check:
            return blocked_token_losses(self.head, hidden, x, self.vocab).cpu()
        r = self._shown - 1
        self.ok = (logits is not None and hidden is not None and hidden.ndim == 3 and hidden.shape[:2] == x.shape
                   and tuple(logits.shape[:2]) == (1, r + 1))
        if self.ok:
            blocked = blocked_token_losses(self.head, hidden, x, self.vocab).cpu()
            ref = token_losses(logits, x[:1, :r + 1]).cpu()
            self.ok = bool(torch.allclose(blocked[:1, :r], ref, rtol=1e-4, atol=1e-5))
            if self.ok:
                return blocked
        return token_losses(_logits(self.model, x), x).cpu()


def position_buckets(seq_len: int) -> list[tuple[int, int]]:
    """Buckets ``[lo, hi)`` of loss positions ``t = 1 .. S - 1`` doubling in width: ``[1, 2)``, ``[2, 4)``, ..."""
    out, lo = [], 1
    while lo < seq_len:
        hi = min(seq_len, 2 * lo)
        out.append((lo, hi))
        lo = hi
    return out


def paired_stats(delta: torch.Tensor, groups: int) -> dict:
    """Mean, standard error and two-sided p-value of per-sequence differences ``delta [N]`` from the
    means of ``groups`` groups (sequence ``n`` in group ``n % groups``): SE = sd of the group means /
    sqrt(G), p from Student's t with G - 1 degrees of freedom. SE and p are None with fewer than two
    groups holding sequences."""
    d = delta.to(torch.float64)
    N = d.numel()
    G = min(groups, N)
    mean = float(d.mean()) if N else float("nan")
    if G < 2:
        return {"mean": mean, "se": None, "p": None, "groups": G}
    g = torch.arange(N) % G
    gm = torch.zeros(G, dtype=torch.float64).index_add_(0, g, d) / torch.bincount(g, minlength=G).to(torch.float64)
    se = float(gm.std(unbiased=True) / math.sqrt(G))
    if se == 0.0:
        p = 1.0 if mean == 0.0 else 0.0
    else:
        from scipy.stats import t as student_t

        p = float(2 * student_t.sf(abs(float(gm.mean())) / se, G - 1))
    return {"mean": float(gm.mean()), "se": se, "p": p, "groups": G}


def bh(ps: list, level: float = NOISE_P) -> list[bool]:
    """Which p-values stay significant at false discovery rate ``level`` (Benjamini–Hochberg, via
    ``scipy.stats.false_discovery_control``); None counts as not significant."""
    idx = [i for i, p in enumerate(ps) if p is not None and math.isfinite(p)]
    out = [False] * len(ps)
    if not idx:
        return out
    from scipy.stats import false_discovery_control

    adj = false_discovery_control([min(max(float(ps[i]), 0.0), 1.0) for i in idx], method="bh")
    for i, a in zip(idx, adj):
        out[i] = bool(a < level)
    return out


def condition_record(name: str, iv: Intervention, layers: list[int], loss0: torch.Tensor, loss: torch.Tensor,
                     buckets: list[tuple[int, int]], groups: int) -> dict:
    """A condition's numbers: the paired loss change overall and per position bucket (mean, SE, p)."""
    delta = loss.to(torch.float64) - loss0.to(torch.float64)  # [N, S - 1], column t - 1 = position t
    rec = {"name": name, "intervention": iv.name, "layers": layers,
           "loss": float(loss.double().mean()), "loss_base": float(loss0.double().mean()),
           "delta": paired_stats(delta.mean(1), groups), "buckets": []}
    for lo, hi in buckets:
        st = paired_stats(delta[:, lo - 1:hi - 1].mean(1), groups)
        rec["buckets"].append({"positions": [lo, hi - 1], **st})
    return rec

