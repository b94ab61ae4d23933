"""``poslens demo``: the whole flow in compact form, on the built-in data, on CPU.

Steps (each writes a run directory under the demo's output folder):

1. the Kim et al. closed form at the paper's Figure 1 setting;
2. the parameter-free simulator: L2 / NoPE (alpha = 0), and RoPE causal vs non-causal (alpha = 0.5);
3. later steps (train, scan, report) are added as those capabilities land.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rich.console import Console

from poslens.simulate import SimConfig, run_simulation, save_result


@dataclass
class DemoConfig:
    out: Path = Path("runs/demo")
    samples: int = 20_000
    device: str = "cpu"
    quick: bool = False  # tests: tiny sizes everywhere


def _step_theory(cfg: DemoConfig, console: Console, progress) -> dict:
    from poslens.reproduce import ReproContext, run_reproduction

    rec = run_reproduction("kim-fig1", cfg.out / "theory", ReproContext(figures=True))[0]
    console.print(f"closed form (Kim et al. Fig. 1): {rec['measured']}")
    return {"theory": str(cfg.out / "theory")}


def _step_simulate(cfg: DemoConfig, console: Console, progress) -> dict:
    from poslens.commands.simulate import print_summary

    samples = 1000 if cfg.quick else cfg.samples
    seq_len = 16 if cfg.quick else 50
    runs = {
        "sim_nope_alpha0": SimConfig(alpha=0.0, samples=samples, seq_len=seq_len, device=cfg.device),
        "sim_rope_causal": SimConfig(alpha=0.5, rope=True, samples=samples, seq_len=seq_len, device=cfg.device),
        "sim_rope_noncausal": SimConfig(alpha=0.5, rope=True, causal=False, samples=samples, seq_len=seq_len,
                                        device=cfg.device),
    }
    for name, sc in runs.items():
        res = run_simulation(sc, progress=lambda d, t, n=name: progress(n, d, t))
        save_result(res, cfg.out / name)
        print_summary(res.summary, console)
    return {name: str(cfg.out / name) for name in runs}


STEPS: list[tuple[str, Callable]] = [
    ("closed-form theory", _step_theory),
    ("parameter-free simulator", _step_simulate),
]


def run_demo(cfg: DemoConfig, console: Console | None = None, show_progress: bool = True) -> dict:
    from poslens.progress import make_progress
    from poslens.rundir import write_json

    console = console or Console()
    outputs: dict = {}
    for i, (title, step) in enumerate(STEPS, 1):
        console.rule(f"[bold]{i}/{len(STEPS)} {title}")
        with make_progress(transient=True) as prog:
            tid = prog.add_task(title, total=None, info="")

            def progress(name, done, total):
                if show_progress:
                    prog.update(tid, description=name, completed=done, total=total)

            outputs.update(step(cfg, console, progress))
    write_json(cfg.out / "demo.json", {"outputs": outputs})
    console.print(f"[bold green]demo finished[/]: results in {cfg.out}/")
    return outputs
