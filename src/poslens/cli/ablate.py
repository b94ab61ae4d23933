"""``poslens ablate``: switch sources of position off, layer by layer, and measure what the model loses."""

from __future__ import annotations

from pathlib import Path

import typer

from poslens.capture.scan.options import MODEL_DIR_HELP
from poslens.cli.app import (allow_pickle_option, app, batch_size_option, data_option, device_option, dtype_option,
                             no_figures_option, num_seqs_option, out_option, overwrite_option, quiet_option,
                             refuse_existing_out, seed_option, seq_len_option, threads_option, trust_remote_code_option,
                             use_threads)

# the defaults live with the library (poslens.analysis.ablate); repeated here so --help needs no torch
DEFAULT_SEQ_LEN = 256
DEFAULT_NUM_SEQS = 32


@app.command("ablate", short_help="Switch sources of position off; measure the loss.")
def ablate(
    model_dir: Path = typer.Argument(..., metavar="MODEL", help=MODEL_DIR_HELP),
    out: Path = out_option("Run directory to create: summary.json, ablate.safetensors (per-token losses), one figure "
                           "per intervention (must be new unless --overwrite)."),
    intervention: list[str] = typer.Option(["rope-off"], "--intervention", "-i", help="What to switch off "
                                           "(repeat for several): rope-off | rope-band:high|medium|low | massive-qk "
                                           "| random-qk (massive-qk's control) | sink-off | window:W."),
    layers: str = typer.Option("each", "--layers", help="each (one decoder layer at a time, from 0) | all (every "
                               "layer together) | a list ablated together, e.g. 0,3,5-7 | each:0-5 (one at a time "
                               "over a list)."),
    data: str = data_option("stdlib"),
    seq_len: int = seq_len_option(DEFAULT_SEQ_LEN),
    num_seqs: int = num_seqs_option(DEFAULT_NUM_SEQS, "Sequences; every condition runs on the same ones."),
    batch_size: int = batch_size_option(4),
    seed: int = seed_option("Seed of --data random and of random-qk's dimensions."),
    noise_groups: int = typer.Option(8, "--noise-groups", help="Sequence groups for the standard errors (sequence n "
                                     "in group n % G)."),
    massive_lambda: float = typer.Option(5.0, "--massive-lambda", help="A q/k dimension is massive when its RMS "
                                         "exceeds this many times the layer's mean (Jin et al. use 5)."),
    readings: bool = typer.Option(False, "--readings", help="Also scan the same sequences under every condition "
                                  "and without one (scores, probs, slash, into scans/): relativity index, sink "
                                  "weight and slash heads under the intervention. One capture forward per "
                                  "condition and batch more."),
    probes: bool = typer.Option(False, "--probes", help="Also fit a linear position probe on every layer's "
                                "residual stream under every condition and without one (fit on the second half of "
                                "the sequences, tested on the first): r and squared error in positions."),
    device: str = device_option(),
    dtype: str = dtype_option("auto", "auto | bf16 | fp16 | fp32 (auto: fp32 on CPU)."),
    no_figures: bool = no_figures_option(),
    overwrite: bool = overwrite_option(),
    allow_pickle: bool = allow_pickle_option(),
    trust_remote_code: bool = trust_remote_code_option(),
    quiet: bool = quiet_option(),
    threads: int = threads_option(),
) -> None:
    """Where position comes from, causally: switch a source of position off and measure the loss.

    Each --intervention is applied in the --layers chosen (by default one decoder layer at a
    time) inside poslens' attention function, and the model's next-token loss on the same
    sequences is compared with the unmodified model's, overall and by position, with standard
    errors from sequence groups. rope-off un-rotates q/k (NoPE); rope-band:B leaves one RoPE
    frequency band unrotated (rope-band:low is p-RoPE); massive-qk replaces the massive pre-RoPE
    q/k dimensions by their mean (random-qk: as many random ones, the control); sink-off masks
    key 0; window:W masks keys more than W positions back. The model is left as it was.
    """
    threads = use_threads(threads)
    from poslens.analysis.ablate.config import AblateConfig
    from poslens.analysis.ablate.run import condition_table, run_ablate

    refuse_existing_out(out, overwrite=overwrite)
    result = run_ablate(AblateConfig(
        model_dir=str(model_dir), out=str(out), interventions=list(intervention), layers=layers, data=data,
        seq_len=seq_len, num_seqs=num_seqs, batch_size=batch_size, seed=seed, noise_groups=noise_groups,
        massive_lambda=massive_lambda, readings=readings, probes=probes, device=device, dtype=dtype, figures=not no_figures, overwrite=overwrite,
        allow_pickle=allow_pickle, trust_remote_code=trust_remote_code), progress=not quiet)
    if quiet:
        return
    from rich.console import Console

    from poslens.fmt import print_table
    from poslens.reporting.readings.ablate import ablate_readings

    summary = result["summary"]
    console = Console()
    t = condition_table(summary)
    print_table(f"Δ next-token loss vs the unmodified model (base {summary['loss_base']:.4f} nats/token; decoder "
                "layers from 0)", ["condition", "Δ loss", "± SE", "p", "beyond noise"],
                [[r[0], r[3], r[4], r[5], "yes" if r[6] else "no"] for r in t["rows"]], console=console)
    for line in ablate_readings(summary):
        console.print(f"- {line}", soft_wrap=False)
    console.print(f"wrote {out}/ (summary.json, ablate.safetensors, figures)")
