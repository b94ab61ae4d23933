"""The papers' interventions as experiments on the real pretrained models (``poslens ablate``).

- ``barbero-prope`` (Barbero et al., ICLR 2025, "Round and round we go"): dropping RoPE's lowest
  frequencies (p-RoPE, ``rope-band:low``) hurts the model less than dropping its highest
  (``rope-band:high``).
- ``jin-massive`` (Jin et al., ICML 2025, arXiv 2502.01563): the massive pre-RoPE q/k dimensions
  matter for using the context: replacing them by their mean (``massive-qk``) raises the loss far more
  than replacing as many random other dimensions (``random-qk``, the control).

Both take every layer at once on :data:`SEQ_LEN` x :data:`NUM_SEQS` stdlib tokens, and judge the
claim by the one verdict rule of :mod:`poslens.metrics.verdicts`: ``value`` is the loss change of the
intervention the claim says matters, ``chance`` the loss change of its control (the band the claim
says matters less, the random dimensions), ``floor = chance + z·SE`` with the standard error of the
paired difference over sequence groups, and the claim holds when ``value − max(chance, floor) ≥``
:data:`THRESHOLD` nats per token.
"""

from __future__ import annotations

from pathlib import Path

import torch

from poslens.fmt import fmt
from poslens.reproduce.simulated import Experiment, ReproContext

SEQ_LEN, NUM_SEQS = 256, 16
#: the loss difference (nats per token) a verdict needs beyond chance and the noise floor
THRESHOLD = 0.05
BARBERO = "Barbero et al., ICLR 2025 (arXiv 2410.06205)"
JIN = "Jin et al., ICML 2025 (arXiv 2502.01563)"


def pair_verdict(summary: dict, tensors: dict, value_cond: str, chance_cond: str, groups: int) -> dict:
    """``value``/``chance``/``floor``/``threshold`` of "``value_cond`` raises the loss more than
    ``chance_cond``", with the SE of the per-sequence difference of the two conditions."""
    from poslens.analysis.ablate.losses import paired_stats
    from poslens.metrics.verdicts import beyond, mean_floor, measured

    c = {x["name"]: x for x in summary["conditions"]}
    v, ch = c[value_cond]["delta"]["mean"], c[chance_cond]["delta"]["mean"]
    diff = (tensors[f"loss.{value_cond}"].double() - tensors[f"loss.{chance_cond}"].double()).mean(1)
    se = paired_stats(diff, groups)["se"]
    floor = mean_floor(ch, se)
    rec = measured(v, ch, floor, THRESHOLD, f"loss change of {value_cond} (nats per token) against {chance_cond}")
    rec["se"] = se
    rec["reproduced"] = beyond(v, ch, floor, THRESHOLD)
    return rec


def _run(name: str, f: Path, ivs: list[str], ctx: ReproContext, out: Path) -> tuple[dict, dict]:
    from poslens.analysis.ablate.config import AblateConfig
    from poslens.analysis.ablate.run import run_ablate

    r = run_ablate(AblateConfig(model_dir=str(f), out=str(out / name), interventions=ivs, layers="all",
                                seq_len=SEQ_LEN, num_seqs=NUM_SEQS, seed=ctx.seed, device=ctx.device,
                                figures=ctx.figures), progress=False)
    return r["summary"], r["tensors"]


def _experiment(ivs: list[str], value_cond: str, chance_cond: str, say) -> callable:
    def run(ctx: ReproContext, out: Path) -> dict:
        from poslens.reproduce.real import real_models_ready

        ready = real_models_ready()
        if not ready:
            return {"measured": "no real model present (run `poslens models fetch`).", "reproduced": None,
                    "note": "not decided: no real model"}
        out.mkdir(parents=True, exist_ok=True)
        lines, runs, ok = [], [], True
        for k, (name, f) in enumerate(ready.items()):
            if ctx.progress:
                ctx.progress(k, len(ready), f"{name}: ablate {', '.join(ivs)}")
            summary, tensors = _run(name, f, ivs, ctx, out)
            v = pair_verdict(summary, tensors, value_cond, chance_cond, summary["noise_groups"])
            ok &= v["reproduced"]
            lines.append(f"{name}: {say(v)} → {'reproduced' if v['reproduced'] else 'not reproduced'} "
                         f"(base loss {fmt(summary['loss_base'])} nats per token).")
            runs.append({"run": name, "model": name, **v, "loss_base": summary["loss_base"]})
        return {"measured": "\n".join(lines), "reproduced": ok, "runs": runs,
                "note": f"every layer at once, {NUM_SEQS} x {SEQ_LEN} stdlib tokens; reproduced = on every model, the "
                        f"loss change beyond the control's and its noise floor by {THRESHOLD} nats per token "
                        "(value − max(chance, floor) ≥ threshold; floor = chance + z·SE of the paired difference, "
                        "one-sided at 0.01)."}
    return run


def _say_barbero(v: dict) -> str:
    return (f"leaving the highest-frequency pairs unrotated raises the loss by {fmt(v['value'])} nats per token, the "
            f"lowest (p-RoPE) by {fmt(v['chance'])} (floor {fmt(v['floor'])}, SE {fmt(v['se'])})")


def _say_jin(v: dict) -> str:
    return (f"replacing the massive q/k dimensions by their mean raises the loss by {fmt(v['value'])} nats per token, "
            f"as many random other dimensions by {fmt(v['chance'])} (floor {fmt(v['floor'])}, SE {fmt(v['se'])})")


def _available() -> bool:
    from poslens.reproduce.real import real_models_ready

    return bool(real_models_ready())


EXPERIMENTS = {
    "barbero-prope": Experiment(
        "barbero-prope", BARBERO + ", p-RoPE",
        "The lowest RoPE frequencies carry meaning rather than position: dropping them (p-RoPE) hurts the model less "
        "than dropping the highest frequencies.",
        _experiment(["rope-band:low", "rope-band:high"], "rope-band:high@all", "rope-band:low@all", _say_barbero),
        available=_available),
    "jin-massive": Experiment(
        "jin-massive", JIN + ", massive Q/K dimensions",
        "The massive values concentrated in a few query and key dimensions are the key to using the context: "
        "disrupting them (replacing them by their mean) hurts far more than disrupting as many other dimensions.",
        _experiment(["massive-qk", "random-qk"], "massive-qk@all", "random-qk@all", _say_jin),
        available=_available),
}
