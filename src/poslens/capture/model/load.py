"""Model directories for a scan: the checks that refuse unsafe or unusable inputs before anything is
loaded (pickle weights, remote code, custom attention), and the loaders of config, tokenizer and
weights with the poslens attention function registered."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

from poslens.capture.model.adapters import get_adapter
from poslens.capture.engine.attention import ATTN_NAME, register
from poslens.capture.model.source import model_directory, quiet_hf_loading
from poslens.errors import OptionError, PoslensError
from poslens.rundir.io import safetensors_shapes


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


# --------------------------------------------------------------------------------------------
# validation and loading
# --------------------------------------------------------------------------------------------
def check_model_dir(model_dir: str, *, allow_pickle: bool, trust_remote_code: bool) -> dict:
    """Refuse missing directories, missing configs, remote code and pickle weights; returns config.json."""
    path = Path(model_dir)
    if not path.exists():
        raise PoslensError(f"MODEL_DIR {path} does not exist; pass a local directory holding config.json and weights, "
                           "or a .gguf file.")
    if not path.is_dir() and path.suffix in PICKLE_SUFFIXES:
        raise OptionError("MODEL_DIR", str(path), f"a pickle checkpoint ({path.suffix}: weights alone, which can run "
                          "code when loaded); put it in a directory beside its config.json and pass that directory "
                          "with {allow_pickle!} if you trust it, or convert it to safetensors.", keyword="model",
                          shown=str(path))
    if not path.is_dir():
        raise PoslensError(f"MODEL_DIR {path} is a file but not a GGUF model; pass the directory holding config.json "
                           "and weights, or a .gguf file.")
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise PoslensError(f"MODEL_DIR {path} has no config.json; pass a Hugging Face model directory "
                           "(save_pretrained output).")
    try:
        raw = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise PoslensError(f"{cfg_path}: not valid JSON ({e.msg}).") from None
    if not isinstance(raw, dict):
        raise PoslensError(f"{cfg_path}: expected a JSON object, found {type(raw).__name__}; restore the file from "
                           "the model's source.")
    _check_config_values(raw, cfg_path)
    if raw.get("auto_map") and not trust_remote_code:
        raise PoslensError(f"{path} needs custom Python code from the model directory (config.json has auto_map), "
                           "which runs arbitrary code; pass --trust-remote-code only if you trust its source.")
    files = [p for p in path.iterdir() if p.is_file()]
    has_st = any(p.suffix == ".safetensors" for p in files)
    has_pickle = any(p.suffix in PICKLE_SUFFIXES for p in files)
    if not has_st:
        if has_pickle and not allow_pickle:
            raise OptionError("MODEL_DIR", str(path), "holds only pickle weights (.bin/.pt), which can run arbitrary "
                              "code when loaded; convert them to safetensors, or pass {allow_pickle!} if you trust "
                              "them.", keyword="model", shown=str(path))
        if not has_pickle:
            raise PoslensError(f"{path} has no weights (*.safetensors); pass a directory written by save_pretrained.")
    return raw


#: config.json fields that must be positive integers where present (top level and text_config)
_INT_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
               "vocab_size", "max_position_embeddings", "head_dim")


#: config.json fields that must be positive finite numbers where present (RoPE bases, norm epsilons)
_POSITIVE_FIELDS = ("rope_theta", "rope_local_base_freq", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon",
                    "norm_eps", "norm_epsilon")


def _check_config_values(raw: dict, cfg_path: Path) -> None:
    """Refuse a config.json whose sizes are not positive integers (``"hidden_size": "abc"``) or whose
    RoPE base or norm epsilon is not a positive finite number (``"rope_theta": -5``: every score of
    the model would be noise)."""
    scopes = [raw, raw.get("text_config")]
    scopes += [s.get("rope_parameters") for s in scopes if isinstance(s, dict)]
    for scope in scopes:
        if not isinstance(scope, dict):
            continue
        for k in _INT_FIELDS:
            v = scope.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise PoslensError(f"{cfg_path}: {k} is {v!r}, not a positive integer; the file is damaged or was "
                                   "edited by hand: restore it from the model's source.")
        for k in _POSITIVE_FIELDS:
            v = scope.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                                  or v <= 0):
                raise PoslensError(f"{cfg_path}: {k} is {v!r}, not a positive finite number; the file is damaged or "
                                   "was edited by hand: restore it from the model's source.")


def check_weight_shapes(model_dir: str | Path, config) -> None:
    """Refuse ``.safetensors`` files cut short or damaged (:func:`poslens.rundir.io.safetensors_shapes`), and
    weights whose tensor shapes differ from the ones ``config`` builds (a config.json edited or mixed
    up with other weights), naming the file and the first tensor; reads only the files' headers.
    Names the model class does not have (other conventions) are left to the loader."""
    from transformers import AutoModelForCausalLM

    files = {f: safetensors_shapes(f) for f in sorted(Path(model_dir).glob("*.safetensors"))}
    if getattr(config, "auto_map", None):  # custom model code: not run for a check
        return
    try:
        with torch.device("meta"), quiet_hf_loading():
            model = AutoModelForCausalLM.from_config(config)
    except Exception:  # noqa: BLE001 - an architecture the meta device cannot build: the loader checks
        return
    expected = {k: list(v.shape) for k, v in model.state_dict().items()}
    prefix = getattr(model, "base_model_prefix", "")
    for f, shapes in files.items():
        for name, shape in shapes.items():
            want = expected.get(name) or expected.get(f"{prefix}.{name}")
            if want is not None and want != shape:
                raise PoslensError(f"{f}: tensor {name} has shape {shape}, but {Path(model_dir) / 'config.json'} "
                                   f"needs {want}; the weights and the config do not belong together (a damaged or "
                                   "mixed-up download).")


def open_model_config(model_dir: str, *, seq_len: int | None = None, allow_pickle: bool = False,
                      trust_remote_code: bool = False, beyond_context: bool | None = None):
    """Check a model directory or ``.gguf`` file (safety, config present), read its config and
    adapter, and check that ``seq_len`` fits the model's positions (``beyond_context``: as
    :func:`check_seq_len`). Returns ``(config, adapter)``;
    loads no weights (a GGUF file is dequantised into the cache on first use,
    :mod:`poslens.capture.model.source`)."""
    from transformers import AutoConfig

    # a .gguf file: checked, dequantised once into the cache (progress bars on a terminal only: this
    # runs before a command's --quiet is known, and in a log they are noise)
    given = str(model_dir)  # what the user passed (a .gguf file is named in the errors, not its cache)
    model_dir = str(model_directory(model_dir, progress=sys.stderr.isatty()))
    check_model_dir(model_dir, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    try:
        config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    except (ValueError, TypeError, KeyError, AttributeError) as e:  # incl. huggingface_hub's field validation
        raise PoslensError(f"{model_dir}/config.json: {' '.join(str(e).split())[:300]}") from None
    adapter = checked_adapter(config, given, seq_len=seq_len, beyond_context=beyond_context)
    check_weight_shapes(model_dir, config)
    return config, adapter


def checked_adapter(config, where: str, *, seq_len: int | None = None, flag: str = "--seq-len",
                    beyond_context: bool | None = None):
    """The adapter of ``config`` once its attention geometry reads (an architecture without one, e.g. a
    state-space model, fails here in one line) and ``seq_len`` fits its positions. ``where`` names the
    model in the errors, ``flag`` the sequence-length option (``seq_len=`` from Python);
    ``beyond_context`` as :func:`check_seq_len`."""
    from poslens.capture.model.adapters import ADAPTERS

    adapter = get_adapter(config)
    try:
        adapter.num_layers(config), adapter.num_heads(config), adapter.head_dim(config)
    except (AttributeError, TypeError, ValueError, ZeroDivisionError) as e:
        raise PoslensError(f"{where}: model type {getattr(config, 'model_type', None)!r} has no attention "
                           f"geometry poslens can read ({str(e).splitlines()[0][:120]}); supported: "
                           f"{', '.join(sorted(ADAPTERS))}.") from None
    check_seq_len(adapter, config, seq_len, where, flag, beyond_context=beyond_context)
    return adapter


def trained_context(adapter, config) -> int | None:
    """The model's trained context: the positions its config declares (``max_position_embeddings``,
    GPT-2's ``n_positions``), or None where it declares none."""
    return adapter.max_positions(config)


def check_seq_len(adapter, config, seq_len: int | None, where: str, flag: str = "--seq-len", *,
                  beyond_context: bool | None = None) -> None:
    """Refuse a ``seq_len`` beyond the model's trained context (``where`` names the model, ``flag`` the
    option). ``beyond_context``: None where the command has no such option (the refusal names only
    ``flag``); False where it has one (``--beyond-context``, ``beyond_context=True`` from Python: the
    refusal names it too); True lets the length pass, except on a model with learned absolute positions,
    whose position table has no row past its trained context."""
    maxpos = trained_context(adapter, config)
    if seq_len is None or maxpos is None or seq_len <= maxpos:
        return
    keyword = flag if not flag.startswith("--") else None  # a keyword given: the option of that name
    flag = "--" + flag.replace("_", "-") if keyword else flag
    name = keyword or flag.lstrip("-").replace("-", "_")
    if not beyond_context:
        offer = "" if beyond_context is None else ", or {beyond_context!} to measure past the trained context"
        raise OptionError(flag, seq_len, f"exceeds the model's maximum of {maxpos} positions ({where}); "
                          f"pass {{{name}={maxpos}}} or less{offer}.", keyword=keyword, sep=" ")
    if adapter.position_table is not None:
        raise OptionError(flag, seq_len, f"with {{beyond_context!}}: model type {adapter.model_type!r} has learned "
                          f"absolute positions (its position table has {maxpos} rows), so it cannot run past "
                          f"position {maxpos} ({where}); pass {{{name}={maxpos}}} or less.", keyword=keyword, sep=" ")


def load_tokenizer(model_dir: str, trust_remote_code: bool = False):
    """The model's tokenizer (directory or ``.gguf`` file), or None when it has none."""
    p = model_directory(model_dir)
    if not any((p / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(p), trust_remote_code=trust_remote_code)
    except Exception as e:  # a broken tokenizer is a data problem, not a crash
        raise PoslensError(f"{p}: could not load the tokenizer ({type(e).__name__}: {e}); "
                           "pass --data random or pre-tokenised JSONL.") from None


def load_model(model_dir: str, *, dtype: torch.dtype, device: str, allow_pickle: bool = False,
               trust_remote_code: bool = False, device_map: str | None = None, verbose: bool = False):
    """``AutoModelForCausalLM.from_pretrained`` with the poslens attention, eval mode, on ``device``;
    ``model_dir`` may be a ``.gguf`` file (its dequantised cache directory is loaded).

    With ``device_map`` (``auto``, ``balanced``, ``sequential``...) accelerate places the layers over
    the visible devices instead (and offloads to the CPU what does not fit); ``device`` is then unused.
    Transformers' load report stays out of the terminal unless ``verbose``; weights that cannot be
    loaded are a one-line :class:`PoslensError` naming the directory.
    """
    from transformers import AutoModelForCausalLM

    register()
    extra = {"device_map": device_map} if device_map else {}
    path = model_directory(model_dir)
    try:
        with quiet_hf_loading(verbose):
            model, info = AutoModelForCausalLM.from_pretrained(
                str(path), dtype=dtype, attn_implementation=ATTN_NAME, output_loading_info=True,
                use_safetensors=None if allow_pickle else True, trust_remote_code=trust_remote_code, **extra,
            )
    except (OSError, RuntimeError, ValueError, TypeError, KeyError) as e:
        if "out of memory" in str(e).lower():
            raise
        detail = " ".join(str(e).split())[:300]
        raise PoslensError(f"{path}: the weights could not be loaded ({type(e).__name__}: {detail}); the model "
                           "directory is damaged or incomplete: download or save it again.") from None
    _warn_missing(path, info)
    return model.eval() if device_map else model.to(device).eval()


def _warn_missing(path, info: dict) -> None:
    """Weights the checkpoint lacks are initialised at random by transformers: the scan would measure
    a model nobody trained. One line names them (the hidden load report lists them all)."""
    import warnings

    from poslens.errors import PoslensWarning

    missing = sorted(info.get("missing_keys") or [])
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        warnings.warn(f"{path}: {len(missing)} weight(s) missing from the checkpoint were initialised at random "
                      f"({', '.join(missing[:3])}{more}); the results describe a partly untrained model "
                      "(poslens --verbose shows transformers' load report).", PoslensWarning, stacklevel=3)
