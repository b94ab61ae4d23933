"""The typer application object. The command modules in :mod:`poslens.cli` attach to it.

Kept separate from ``poslens/cli/__init__.py`` so a command module can import ``app`` without
import cycles; the package ``__init__`` imports every command module and runs the app.
"""

from __future__ import annotations

import typer

from poslens.capture.scan.options import ALLOW_PICKLE_HELP, DATA_HELP, DEVICE_HELP, MODEL_DIR_HELP, NO_FIGURES_HELP
from poslens.errors import PoslensError


app = typer.Typer(
    name="poslens",
    help=(
        "Measure where positional information in causal transformers comes from: the causal mask, "
        "RoPE, and their interaction. Start with `poslens demo`."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


#: the token of ``--verbose``'s setting for the command in progress (reset by :func:`reset_verbose`)
_verbose_token: list = []


@app.callback()
def _global_options(verbose: bool = typer.Option(False, "--verbose", help="Show transformers' own model-loading "
                                                 "reports (hidden by default: poslens says in one line what is "
                                                 "wrong). Before the command: poslens --verbose scan ...")) -> None:
    """Measure where positional information in causal transformers comes from: the causal mask, RoPE, and
    their interaction. Start with `poslens demo`."""
    if verbose:
        from poslens.capture.model.source import SHOW_LOAD_REPORTS

        _verbose_token.append(SHOW_LOAD_REPORTS.set(True))


#: the arguments of the command in progress, as given (set by :func:`poslens.cli.main`)
_command_line: list[list[str]] = []


def set_command_line(args: list[str] | None) -> None:
    """Record the arguments the command in progress was given (None: none, the command has ended)."""
    _command_line.clear()
    if args is not None:
        _command_line.append([str(a) for a in args])


def resume_command() -> str:
    """The command in progress as given, ready to paste, with ``--resume`` in place of ``--overwrite``
    (the two contradict each other): what continues an interrupted run."""
    import shlex

    args = [a for a in (_command_line[0] if _command_line else []) if a != "--overwrite"]
    if "--resume" not in args:
        args.append("--resume")
    return "poslens " + shlex.join(args)


def reset_verbose() -> None:
    """``--verbose`` ends with its command (an in-process caller's next command starts without it)."""
    if _verbose_token:
        from poslens.capture.model.source import SHOW_LOAD_REPORTS

        SHOW_LOAD_REPORTS.reset(_verbose_token.pop())


# The CLI conventions of docs/cli.md, one definition each, so every command spells them alike. The
# words of the options a command shares with `poslens scan` are the scan's (poslens.capture.scan.options).

def quiet_option(help: str = "No progress bars and no result table (errors still print).") -> bool:
    return typer.Option(False, "--quiet", help=help)


def device_option(extra: str = "") -> str:
    return typer.Option("auto", "--device", help=DEVICE_HELP + extra)


def no_figures_option() -> bool:
    return typer.Option(False, "--no-figures", help=NO_FIGURES_HELP)


def allow_pickle_option() -> bool:
    return typer.Option(False, "--allow-pickle", help=ALLOW_PICKLE_HELP)


def trust_remote_code_option(help: str = "Allow custom model code.") -> bool:
    return typer.Option(False, "--trust-remote-code", help=help)


def overwrite_option(what: str = "the run directory --out", help: str | None = None) -> bool:
    return typer.Option(False, "--overwrite", help=help or f"Replace {what} if it already exists (refused without it).")


def resume_option(help: str) -> bool:
    """``--resume`` (docs/cli.md): ``help`` says what is continued and from where."""
    return typer.Option(False, "--resume", help=help)


def model_dir_argument(help: str = MODEL_DIR_HELP):
    """The ``MODEL_DIR`` argument."""
    return typer.Argument(..., metavar="MODEL_DIR", help=help)


def scan_dir_argument(help: str = "Run directory of a finished `poslens scan`."):
    """The ``SCAN_DIR`` argument of the analyses that read a scan."""
    return typer.Argument(..., metavar="SCAN_DIR", help=help)


def out_option(help: str = "Run directory to create (must be new unless --overwrite).", default=...):
    """``--out`` (required unless ``default`` is given)."""
    return typer.Option(default, "--out", help=help)


def data_option(default: str, help: str = DATA_HELP) -> str:
    return typer.Option(default, "--data", help=help)


def seq_len_option(default: int, help: str = "Tokens per sequence.") -> int:
    return typer.Option(default, "--seq-len", help=help)


def num_seqs_option(default: int, help: str = "Sequences to average over.") -> int:
    """``--num-seqs``: the one name of a sequence count (docs/cli.md)."""
    return typer.Option(default, "--num-seqs", help=help)


def batch_size_option(default, help: str = "Sequences per forward pass."):
    return typer.Option(default, "--batch-size", help=help)


def seed_option(help: str = "Seed of --data random.") -> int:
    return typer.Option(0, "--seed", min=0, max=2**32 - 1, help=help)


def dtype_option(default: str, help: str = "auto | bf16 | fp16 | fp32 (sums are float64 regardless).") -> str:
    return typer.Option(default, "--dtype", help=help)


def refuse_existing_out(out, *, overwrite: bool, resume: bool | None = None, command: str | None = None) -> None:
    """The existing-output convention for a run directory ``out`` (docs/cli.md), checked before any
    work starts by :func:`poslens.rundir.outdir.check_out_dir`, with the directory locked for the rest
    of the command (:func:`poslens.rundir.lock.lock_out_dir`) before its contents are checked: a second
    poslens process writing it is refused, naming the first. ``resume``: pass it only for a command that
    can continue a run. ``overwrite`` replaces only a run directory of the same ``command`` (default:
    the command being run); a container (``demo``) checks what it may replace itself.

    :func:`poslens.cli.main` gives the lock back when the command ends."""
    from poslens.rundir.outdir import check_out_dir

    command = command or _current_command()
    if command in _CONTAINERS:  # its run directories are each locked by the run that writes it
        check_out_dir(out, command=None, overwrite=overwrite, resume=resume)
        return
    check_out_dir(out, command=command, overwrite=overwrite, resume=resume,
                  hold=lambda path: hold_out_dir(path, command=command, overwrite=overwrite))


#: commands whose --out holds other commands' run directories, each locked by the run that writes it;
#: the command itself decides what --overwrite may replace
_CONTAINERS = ("demo",)


#: run directories this CLI command holds (given back by :func:`release_out_dirs`)
_held: list = []


def hold_out_dir(path, *, command: str | None = None, overwrite: bool = False) -> None:
    """Lock run directory ``path`` until the command ends (:func:`release_out_dirs`). Under torchrun
    rank 0 alone holds it: the ranks of one job write one directory together."""
    import os

    from poslens.rundir.lock import lock_out_dir

    if os.environ.get("RANK", "0") not in ("", "0"):
        return
    _held.append(lock_out_dir(path, command=command or _current_command(), overwrite=overwrite))


def fail_out_dirs() -> None:
    """Mark every run directory the command holds as written by a failed run
    (:func:`poslens.rundir.lock.mark_failed`): one that was new is emptied when it is given back."""
    from poslens.rundir.lock import mark_failed

    for path in _held:
        mark_failed(path)


def release_out_dirs() -> None:
    """Give back every run directory lock the command took (called by :func:`poslens.cli.main`)."""
    from poslens.rundir.lock import unlock_out_dir

    while _held:
        unlock_out_dir(_held.pop())


def _current_command() -> str | None:
    """The name of the command being run (``scan``, ``simulate``...), from click's context."""
    from typer._click.globals import get_current_context

    ctx = get_current_context(silent=True)
    return ctx.info_name if ctx is not None else None


def threads_option() -> int:
    """The ``--threads`` option of every command that computes (see :mod:`poslens.runtime`)."""
    return typer.Option(0, "--threads", min=0,
                        help="CPU threads for torch. 0 (default): the CPUs not busy with other processes "
                             "right now, at least 1 (a thread sharing a core with a busy process slows the "
                             "others down).")


#: torch's thread count before the first ``--threads`` took effect (restored by :func:`restore_threads`)
_threads_before: list[int] = []


def use_threads(threads: int) -> int:
    """Apply ``--threads`` for the rest of the command; returns the count in force.
    :func:`poslens.cli.main` restores the previous count when the command ends."""
    import torch

    from poslens.runtime import apply_threads

    if not _threads_before:
        _threads_before.append(torch.get_num_threads())
    return apply_threads(threads)


def restore_threads() -> None:
    """torch's thread count as it was before :func:`use_threads` (nothing if no command set it)."""
    if _threads_before:
        import torch

        torch.set_num_threads(_threads_before.pop())


def print_run(summary: dict, out, *, command: str | None = None, notes: tuple | list = (),
              max_tables: int | None = None, max_rows: int | None = None) -> None:
    """The terminal result of an analysis command: its summary's tables (the first ``max_tables``,
    each cut to ``max_rows`` rows), its readings (the sentences it holds, else those of ``command``
    rendered from its judgement, as the report renders them), ``notes``, and where it wrote them."""
    from rich.console import Console

    from poslens.fmt import rich_table
    from poslens.reporting.readings.commands import command_readings

    console = Console()
    tables = [t for t in summary.get("tables", []) if t["rows"]]
    for t in tables[:max_tables]:
        console.print(rich_table(t["title"], t["columns"], t["rows"][:max_rows]))
    readings = summary.get("readings") or (command_readings(command, summary) if command else None) or []
    for line in [*readings, *notes]:
        console.print(f"- {line}")
    if max_tables is not None and len(tables) > max_tables:
        console.print(f"({len(tables) - max_tables} more table(s) in {out}/summary.json)")
    console.print(f"wrote {out}/")


def parse_floats(text: str, flag: str) -> list[float]:
    """``"0.1,0.3"`` -> ``[0.1, 0.3]``; a one-line error naming ``flag`` for anything else or nothing."""
    try:
        vals = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise PoslensError(f"{flag} {text!r}: expected comma-separated numbers, e.g. 0.002,0.02,0.2.") from None
    if not vals:
        raise PoslensError(f"{flag}: give at least one value.")
    return vals
