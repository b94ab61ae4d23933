"""Entry point of the ``poslens`` command: options -> config dataclass -> library call.

One module per command group attaches its commands to :data:`poslens.cli.app.app`;
:func:`command` builds the click command (commands listed in the order of the flow) and
:func:`main` runs it with one error convention: every bad input, whether typer rejects it (a
typo'd number, an unknown option) or the library does (:class:`PoslensError`), becomes one
``poslens: error: ...`` line on stderr and exit code 2. The conventions are in docs/cli.md.
Nothing outside this package imports it.
"""

from __future__ import annotations

import os
import signal
import sys
import types

import typer
import typer.main

import warnings

from poslens.runtime import configure_allocator, configure_process

from poslens.cli.app import (app, fail_out_dirs, release_out_dirs, reset_verbose, restore_threads,  # noqa: E402
                             set_command_line)
from poslens.errors import Interrupted, PoslensError  # noqa: E402

# Each import attaches its commands to `app` (one module per command group).
from poslens.cli import simulate as _simulate  # noqa: F401,E402
from poslens.cli import theory as _theory  # noqa: F401,E402
from poslens.cli import train as _train  # noqa: F401,E402
from poslens.cli import models as _models  # noqa: F401,E402
from poslens.cli import scan as _scan  # noqa: F401,E402
from poslens.cli import neighborhood as _neighborhood  # noqa: F401,E402
from poslens.cli import kim_slash as _kim_slash  # noqa: F401,E402
from poslens.cli import fingerprint as _fingerprint  # noqa: F401,E402
from poslens.cli import ablate as _ablate  # noqa: F401,E402
from poslens.cli import compare as _compare  # noqa: F401,E402
from poslens.cli import report as _report  # noqa: F401,E402
from poslens.cli import explore as _explore  # noqa: F401,E402
from poslens.cli import reproduce as _reproduce  # noqa: F401,E402
from poslens.cli import demo as _demo  # noqa: F401,E402

#: ``poslens --help`` lists the commands in the order of the flow: source and model (simulate,
#: theory, train, zoo, models) -> capture (scan) -> analyses -> report, then the end-to-end runs.
FLOW_ORDER = ("simulate", "theory", "train", "zoo", "models", "scan", "neighborhood", "sweep", "probes", "panels",
              "kim-maps", "slash", "slash-dynamics", "fingerprint", "ablate", "compare", "report", "explore", "reproduce", "demo")


def command():
    """The click command of ``poslens`` (a group), its commands in :data:`FLOW_ORDER`, usage lines
    in the usual ``poslens scan [OPTIONS] MODEL_DIR`` form."""
    group = typer.main.get_command(app)
    missing = set(group.commands) ^ set(FLOW_ORDER)
    if missing:  # a new command must be placed in the flow
        raise RuntimeError(f"poslens.cli.FLOW_ORDER and the registered commands differ: {sorted(missing)}")
    group.commands = {name: group.commands[name] for name in FLOW_ORDER}
    for cmd in walk(group):
        for param in cmd.params:
            if param.param_type_name == "argument":
                param.get_usage_pieces = types.MethodType(_argument_usage, param)
    return group


def walk(cmd):
    """``cmd`` and every command below it (depth first, in listing order)."""
    yield cmd
    for sub in getattr(cmd, "commands", {}).values():
        yield from walk(sub)


def _argument_usage(param, ctx) -> list[str]:
    """``MODEL_DIR``, ``RUN_DIR...``, ``[NAME]...`` (typer's default writes ``{model_dir}``)."""
    name = param.metavar or param.name.upper()
    more = "..." if param.nargs != 1 else ""
    return [f"{name}{more}" if param.required else f"[{name}]{more}"]


def _usage_error_line(e) -> str:
    """One line for a click usage error, naming the command and where its help is."""
    msg = " ".join(e.format_message().split())
    ctx = getattr(e, "ctx", None)
    where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    return f"poslens: error: {msg}{where}"


#: the signal that ended the command, when one did (SIGTERM's handler records it; Ctrl-C is SIGINT)
_signalled: list[int] = []


def _on_sigterm(signum, frame) -> None:
    """SIGTERM (a killed job, a scheduler's time limit) is an interrupt like Ctrl-C: the command
    writes its checkpoint and ends with exit code 143. A second SIGTERM while it does is ignored."""
    if _signalled:
        return
    _signalled.append(signum)
    raise KeyboardInterrupt


def entry_process_settings() -> None:
    """The process-wide choices of the ``poslens`` command, made by its entry point only (importing
    poslens or its CLI module makes none): OpenMP threads sleep instead of spinning while they wait
    (set before torch is imported), and freed activations are reused rather than unmapped and
    faulted in again (glibc; ``POSLENS_MALLOC=system`` opts out)."""
    configure_process()
    configure_allocator()


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; every error becomes one ``poslens: error:`` line on stderr and exit code 2.

    One interrupt policy (docs/cli.md): Ctrl-C (SIGINT) and SIGTERM both stop the command through
    ``finally`` blocks (staging directories removed, run directory locks given back) and a
    checkpoint where the command has one, then print ``poslens: interrupted`` and exit with 130
    (SIGINT) or 143 (SIGTERM).

    Called in-process (tests, a notebook), it leaves the process as it found it: the SIGTERM
    handler, the warning format and torch's thread count (``--threads``) are restored when the
    command ends. Only as the process's entry point (``argv`` None) does it set the process-wide
    policies of :mod:`poslens.runtime` (OpenMP wait policy, glibc allocator): importing the CLI
    changes nothing."""
    if argv is None:  # the process's entry point (the `poslens` script, `python -m poslens`)
        entry_process_settings()
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started in the background by a shell script:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # SIGINT still ends the run
    from poslens.errors import one_line_warnings

    old_format = warnings.formatwarning
    warnings.formatwarning = one_line_warnings(old_format)
    _signalled.clear()
    old_term = signal.signal(signal.SIGTERM, _on_sigterm)
    set_command_line(sys.argv[1:] if argv is None else argv)
    stopped = None
    try:
        _run(argv)
    except SystemExit as e:
        if argv is not None or e.code not in (128 + signal.SIGINT, 128 + signal.SIGTERM):
            raise
        stopped = e.code
    finally:
        set_command_line(None)
        signal.signal(signal.SIGTERM, old_term)
        warnings.formatwarning = old_format
        reset_verbose()
        release_out_dirs()
        restore_threads()
    if stopped is not None:  # interrupted, everything given back: no thread left behind keeps the process alive
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(stopped)


def _interrupted(detail: str = "") -> None:
    print("poslens: interrupted" + (f": {detail}" if detail else ""), file=sys.stderr)
    sys.exit(128 + (_signalled[0] if _signalled else signal.SIGINT))


def _run(argv: list[str] | None) -> None:
    from typer._click.exceptions import NoArgsIsHelpError

    try:
        rc = command().main(args=argv, prog_name="poslens", standalone_mode=False)
    except Interrupted as e:  # a checkpoint was saved: the message says where and how to continue
        release_out_dirs()
        _interrupted(str(e))
    except PoslensError as e:
        fail_out_dirs()  # what a failed run wrote into a new --out goes (an interrupt keeps its checkpoint)
        print(f"poslens: error: {e.cli()}", file=sys.stderr)
        sys.exit(2)
    except NoArgsIsHelpError as e:  # `poslens` or `poslens theory` alone: the help text
        e.show()
        sys.exit(e.exit_code)
    except typer.TyperException as e:  # click's UsageError/BadParameter (typer vendors click)
        print(_usage_error_line(e), file=sys.stderr)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        _interrupted()
    if rc == 130:  # Ctrl-C or SIGTERM (typer turns KeyboardInterrupt into exit code 130)
        _interrupted()
    if isinstance(rc, int) and rc:
        sys.exit(rc)


if __name__ == "__main__":
    main()
