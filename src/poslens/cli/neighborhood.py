"""``poslens neighborhood``, ``poslens sweep``, ``poslens probes``: the analyses of arXiv 2501.00073."""

from __future__ import annotations

from pathlib import Path

import typer

from poslens.cli.app import (allow_pickle_option, app, batch_size_option, data_option, device_option,
                             model_dir_argument, no_figures_option, num_seqs_option, out_option, overwrite_option,
                             print_run, quiet_option, refuse_existing_out, seed_option, seq_len_option,
                             threads_option, trust_remote_code_option, use_threads)
from poslens.runtime import parse_device


@app.command("neighborhood", short_help="Similarity of nearby hidden states (APS), per layer.")
def neighborhood(
    model_dir: Path = model_dir_argument(),
    out: Path = out_option(),
    data: str = data_option("random"),
    seq_len: int = seq_len_option(64, "Tokens per sequence T (APS costs O(T^3) per sequence)."),
    num_seqs: int = num_seqs_option(32, "Sequences; APS is reported as mean ± std over them."),
    batch_size: int = batch_size_option(8),
    seed: int = seed_option("Seed of --data random and --chars."),
    chars: str = typer.Option(None, "--chars", help="Instead of --data: i.i.d. random sequences over these "
                              "characters (each one token; after BOS when the tokenizer has one), e.g. 0123456789."),
    bidirectional: bool = typer.Option(False, "--bidirectional", help="Also run the control without the causal "
                                       "mask and report it beside the causal numbers."),
    device: str = device_option(),
    no_figures: bool = no_figures_option(),
    overwrite: bool = overwrite_option(),
    allow_pickle: bool = allow_pickle_option(),
    trust_remote_code: bool = trust_remote_code_option(),
    quiet: bool = quiet_option(),
    threads: int = threads_option(),
) -> None:
    """Self-cosine maps, adjacency probability score and norm score per layer (arXiv 2501.00073).

    Layers: the token embeddings, then decoder layers counted from 0 (layer l: the concatenated head
    outputs of decoder layer l before the output projection; the residual stream is measured too). APS counts, over
    position triples j < k < i, how often cos(h_i, h_k) > cos(h_i, h_j): 1 = similarity rises
    towards the diagonal, 0.5 = chance. Writes config.json, neighborhood.safetensors,
    summary.json and figures to OUT.
    """
    threads = use_threads(threads)
    from poslens.analysis.neighborhood import NeighborhoodConfig, run_neighborhood

    refuse_existing_out(out, overwrite=overwrite)
    cfg = NeighborhoodConfig(model_dir=str(model_dir), out=str(out), data=data, seq_len=seq_len, num_seqs=num_seqs,
                             batch_size=batch_size, seed=seed, bidirectional=bidirectional, chars=chars, device=device,
                             figures=not no_figures, overwrite=overwrite, allow_pickle=allow_pickle,
                             trust_remote_code=trust_remote_code)
    summary = run_neighborhood(cfg, progress=not quiet)
    if not quiet:
        print_run(summary, out, command="neighborhood")


@app.command("sweep", short_help="APS of untrained models over init scale and shape.")
def sweep(
    out: Path = out_option(),
    sigmas: str = typer.Option("0.0002,0.002,0.02,0.08,0.2,2", "--sigmas", help="Init standard deviations σ "
                               "(comma-separated; the paper's grid by default)."),
    shapes: str = typer.Option("6x384,2x384,6x128", "--shapes", help="LAYERSxWIDTH shapes (head dim 64), "
                               "comma-separated: the paper's 6x384, a shallower and a narrower one by default."),
    seq_len: int = seq_len_option(64, "Characters per random sequence."),
    num_seqs: int = num_seqs_option(16, "Random sequences per model (APS mean ± std over them)."),
    batch_size: int = batch_size_option(16),
    seed: int = seed_option("Seed of the weights and the sequences."),
    no_bidirectional: bool = typer.Option(False, "--no-bidirectional", help="Skip the non-causal control."),
    device: str = device_option(),
    no_figures: bool = no_figures_option(),
    overwrite: bool = overwrite_option(),
    quiet: bool = quiet_option(),
    threads: int = threads_option(),
) -> None:
    """Random-init sweep (arXiv 2501.00073): APS of untrained NoPE models over init σ, depth and width.

    Every weight matrix and the embedding are drawn from N(0, σ²); the same draw is rescaled for
    every σ. APS is measured per layer on i.i.d. random printable-ASCII sequences, causal and
    bidirectional. The default (3 shapes x 6 σ x 2 modes) takes about a minute on one CPU core.
    """
    threads = use_threads(threads)
    from poslens.analysis.sweep import SweepConfig, run_sweep
    from poslens.cli.app import parse_floats

    refuse_existing_out(out, overwrite=overwrite)
    cfg = SweepConfig(out=str(out), sigmas=parse_floats(sigmas, "--sigmas"),
                      shapes=[s.strip() for s in shapes.split(",") if s.strip()], seq_len=seq_len,
                      num_seqs=num_seqs, batch_size=batch_size, seed=seed, bidirectional=not no_bidirectional,
                      device=parse_device(device), figures=not no_figures, overwrite=overwrite)
    summary = run_sweep(cfg, progress=not quiet)
    if not quiet:
        print_run(summary, out, command="sweep")


@app.command("probes", short_help="Position probes: cosine to the last token vs norm.")
def probes(
    model_dirs: list[Path] = model_dir_argument("One or more local model directories or .gguf files (with "
                                                "tokenizer), e.g. a NoPE and a RoPE model."),
    out: Path = out_option(),
    train_chars: str = typer.Option("01234", "--train-chars",
                                    help="Characters of the sequences the probes are fit on."),
    test_chars: str = typer.Option("56789", "--test-chars", help="Disjoint characters of the test sequences."),
    seq_len: int = seq_len_option(64, "Tokens per sequence T (a BOS token first when the tokenizer has one)."),
    num_train_seqs: int = typer.Option(64, "--num-train-seqs", help="Sequences the probes are fit on."),
    num_test_seqs: int = typer.Option(32, "--num-test-seqs", help="Sequences the probes are scored on."),
    batch_size: int = batch_size_option(16),
    mlp_steps: int = typer.Option(300, "--mlp-steps", help="Full-batch Adam steps of each MLP probe."),
    no_random_init: bool = typer.Option(False, "--no-random-init", help="Skip the random-init copy of each model."),
    vectors: str = typer.Option("attn", "--vectors", help="attn: head outputs before the output projection (the "
                                "paper's); resid: residual stream after each layer."),
    labels: str = typer.Option(None, "--labels", help="Comma-separated display names, one per MODEL_DIR."),
    seed: int = seed_option("Seed of the sequences, the random-init copies and the MLP probes."),
    device: str = device_option(),
    no_figures: bool = no_figures_option(),
    overwrite: bool = overwrite_option(),
    allow_pickle: bool = allow_pickle_option(),
    trust_remote_code: bool = trust_remote_code_option(),
    quiet: bool = quiet_option(),
    threads: int = threads_option(),
) -> None:
    """Position probes (arXiv 2501.00073): does cos(h_i, h_T) or ‖h_i‖ predict position better?

    Per layer, linear and MLP (d -> 64 -> 1) probes predict the absolute position from h_i, and
    T - i from the scalars cos(h_i, h_T) and ‖h_i‖. Probes are fit on random sequences over
    --train-chars and scored (Pearson r, MSE) on sequences over --test-chars; each model is
    compared with a random-init copy of its architecture.
    """
    threads = use_threads(threads)
    from poslens.analysis.probes import ProbesConfig, run_probes

    refuse_existing_out(out, overwrite=overwrite)
    cfg = ProbesConfig(model_dirs=[str(d) for d in model_dirs], out=str(out), train_chars=train_chars,
                       test_chars=test_chars, seq_len=seq_len, num_train=num_train_seqs, num_test=num_test_seqs,
                       batch_size=batch_size, mlp_steps=mlp_steps, random_init=not no_random_init, vectors=vectors,
                       seed=seed, device=device, figures=not no_figures, overwrite=overwrite,
                       allow_pickle=allow_pickle, trust_remote_code=trust_remote_code,
                       labels=[s.strip() for s in labels.split(",")] if labels else [])
    summary = run_probes(cfg, progress=not quiet)
    if not quiet:
        print_run(summary, out, command="probes", max_tables=1)
