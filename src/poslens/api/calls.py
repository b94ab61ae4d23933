"""What every function of :mod:`poslens.api` shares: the run directory of a call, its threads,
the model argument, the scan keywords and their documentation, the tokenizer of text data."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import tempfile
import textwrap
import weakref
from pathlib import Path
from typing import Any, Iterator

from poslens.capture.scan.options import scan_options
from poslens.errors import PoslensError
from poslens.api.result import Result


# --------------------------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _run_dir(out, *, overwrite: bool = False) -> Iterator[tuple[Path, Any]]:
    """``(directory to write, TemporaryDirectory or None)``: ``out``, or a fresh temporary directory that is
    removed again if the run fails. An existing ``out`` to ``overwrite`` is checked to be a directory
    poslens can write (a scan checks its ``out`` when it plans, :func:`poslens.rundir.outdir.check_out_dir`)."""
    if out is not None:
        out = Path(out)
        if out.exists() and overwrite:
            from poslens.rundir.outdir import prepare_out_dir

            prepare_out_dir(out, must_be_new=False)
        yield out, None
        return
    tmp = tempfile.TemporaryDirectory(prefix="poslens-")
    try:
        yield Path(tmp.name) / "run", tmp
    except BaseException:
        tmp.cleanup()
        raise


def _finish(path: Path, tmp, cls: type = Result) -> Result:
    """The finished run as a ``cls`` (a :class:`Result`); a temporary directory goes with the object."""
    r = cls(path, _tmp=tmp)
    if tmp is not None:
        weakref.finalize(r, tmp.cleanup)
    return r


@contextlib.contextmanager
def _threads(n):
    """torch's CPU threads for one call, restored after it (and Python's global ``random`` state, which
    the call leaves as it found it): ``"auto"`` the CLI's policy (the CPUs not
    busy with other processes, :func:`poslens.runtime.default_threads`), an int that count, None
    unchanged."""
    from poslens.runtime import random_state_kept, resolve_threads, set_threads

    with random_state_kept():  # the caller's global random stream, whatever the call imports or draws
        if n is None:
            yield
            return
        if n != "auto" and (isinstance(n, bool) or not isinstance(n, int)):
            raise PoslensError(f"threads={n!r}: pass 'auto', a positive count, or None (leave torch's setting).")
        if n != "auto":
            resolve_threads(n, "threads=")
        with set_threads(None if n == "auto" else n):
            yield


def _model_arg(model) -> tuple[str, Any]:
    """``(model_dir string, loaded model or None)``."""
    if isinstance(model, (str, os.PathLike)):
        return str(model), None
    if isinstance(model, Result):
        raise PoslensError("model: a Result is not a model; pass a loaded causal LM or a model path.")
    from poslens.capture.model.borrow import check_causal_lm

    check_causal_lm(model)
    return f"<in-memory {type(model).__name__}: {getattr(model, 'name_or_path', '') or 'unnamed'}>", model


def _scan_keywords(fn):
    """``fn`` with the options of a scan as keywords: ``fn(model, *, <its own keywords>, **options)``
    gets every option of :class:`~poslens.capture.scan.options.ScanConfig` that Python passes. Its
    signature lists them (default and annotation, for ``help()`` and notebooks) and its docstring says
    what each means; a call binds to that signature, so an unknown keyword is a TypeError."""
    own = list(inspect.signature(fn, eval_str=True).parameters.values())
    options = [o for o in scan_options() if o.python]
    P = inspect.Parameter

    def param(o, kind):
        return P(o.name, kind, default=o.python_default, annotation=o.python_type)

    params = [p for p in own if p.kind == P.POSITIONAL_OR_KEYWORD] + \
        [param(o, P.POSITIONAL_OR_KEYWORD) for o in options if o.python == "positional"] + \
        [p for p in own if p.kind == P.KEYWORD_ONLY] + \
        [param(o, P.KEYWORD_ONLY) for o in options if o.python == "keyword"]
    sig = inspect.Signature(params, return_annotation=inspect.signature(fn, eval_str=True).return_annotation)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return fn(**bound.arguments)

    call.__signature__ = sig
    call.__annotations__ = {p.name: p.annotation for p in params}
    call.__doc__ = inspect.cleandoc(fn.__doc__ or "") + "\n\n" + _options_doc(options)
    return call


def _options_doc(options) -> str:
    """The docstring section of the scan options: ``name: type = default`` and what it means."""
    lines = ["Scan options (each also a flag of ``poslens scan``, ``seq_len`` as ``--seq-len``):", ""]
    for o in options:
        lines.append(f"{o.name}: {inspect.formatannotation(o.python_type)} = {o.python_default!r}")
        lines += textwrap.wrap(o.help, 96, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(lines)


def _text_tokenizer(loaded, data, tokenizer):
    """The tokenizer a loaded model's named text data (``"stdlib"``, a text file) needs: ``tokenizer``, else
    the one saved beside the model; none found is an error in Python's words (``tokenizer=``)."""
    if tokenizer is not None or loaded is None or str(data) == "random" or str(data).endswith(".jsonl"):
        return tokenizer
    from poslens.capture.scan.plan import text_tokenizer

    return text_tokenizer(loaded, data)


def _check_keywords(options: dict) -> None:
    """A scan keyword of the wrong type (``seq_len='32'``, ``seq_len=16.5``, ``data=None``), refused in
    one line naming the keyword, before anything is made."""
    import types
    import typing

    if options.get("data") is None:
        raise PoslensError("data=None: pass 'stdlib' (the default), 'random', a .jsonl/.txt path, a list of "
                           "strings or token-id lists, or an [N, S] integer tensor.")
    for o in scan_options():
        v = options.get(o.name)
        if not o.python or v is None:
            continue
        t = o.type
        kinds = set(typing.get_args(t)) - {type(None)} if typing.get_origin(t) in (typing.Union, types.UnionType) \
            else {t}
        if kinds == {int} and (isinstance(v, bool) or not isinstance(v, int)):
            raise PoslensError(f"{o.name}={v!r}: pass an integer.")
        if kinds == {float} and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise PoslensError(f"{o.name}={v!r}: pass a number.")
        if kinds == {bool} and not isinstance(v, bool):
            raise PoslensError(f"{o.name}={v!r}: pass True or False.")


def _run_path(run, what: str) -> Path:
    if isinstance(run, Result):
        return run.path
    if isinstance(run, (str, os.PathLike)):
        return Path(run)
    raise PoslensError(f"{what}: expected a poslens Result or a run directory; got {type(run).__name__}.")


def _model_dir_of(result: Result) -> str | None:
    md = (result.config.get("options") or {}).get("model_dir")
    if isinstance(md, str) and not md.startswith("<in-memory"):
        return md if Path(md).exists() else None  # moved since: the command reading it says so
    src = result.config.get("model_source") or {}
    name = src.get("name_or_path")
    return name if name and Path(name).exists() else None


def _config(cls, **fields):
    """``cls(**fields)``, an unknown field named as a :class:`PoslensError`."""
    import dataclasses

    known = {f.name for f in dataclasses.fields(cls)}
    bad = sorted(set(fields) - known)
    if bad:
        raise PoslensError(f"unknown option(s) {', '.join(bad)}; {cls.__name__} takes {', '.join(sorted(known))}.")
    return cls(**fields)
