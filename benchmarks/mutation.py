"""Mutation testing of the science modules with mutmut: how many small wrong changes do the tests catch?

A thin driver around `mutmut <https://pypi.org/project/mutmut/>`_ (3.x, ``pip install mutmut``; not
a dependency of poslens, and not part of the default test run). For each target module it

1. refreshes a scratch project under ``build/mutation/<module>/`` (a copy of ``src/`` and ``tests/``
   plus a ``pyproject.toml`` whose ``[tool.mutmut]`` section mutates only that module and runs only
   the module's focused test selection, ``TARGETS`` below); mutmut's own cache (``mutants/``) is
   kept between runs, so a rerun tests only the functions whose code changed, new tests, and the
   mutants named with ``--rerun-survivors``;
2. runs ``mutmut run --max-children N`` there (mutmut records which of the selected tests reach
   each function and runs only those per mutant; torch is not fork-safe, so workers come from
   mutmut's fork server);
3. reads every mutant's status back and prints a per-module table: mutants, killed (a test failed
   or the run timed out), survived, the survivors explained as equivalent (``EQUIVALENT``: a
   mutant that changes no observable result, with the reason; ``docs/mutation.md`` lists them),
   and the score = killed / (mutants - equivalent).

Usage::

    python benchmarks/mutation.py --list                    # targets and their test selections
    python benchmarks/mutation.py metrics/rank.py           # one module (minutes on one core)
    python benchmarks/mutation.py                           # every target, one after the other
    python benchmarks/mutation.py metrics/rank.py --rerun-survivors   # after adding tests
    python benchmarks/mutation.py --report                  # table + docs/mutation.md from the cache

Writes ``benchmarks/results_mutation.json`` (per module: counts, score, every survivor with its
diff and, where equivalent, the reason) and, with ``--doc``, ``docs/mutation.md``.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "mutation"
RESULTS = ROOT / "benchmarks" / "results_mutation.json"
DOC = ROOT / "docs" / "mutation.md"

#: module (path under src/poslens) -> pytest arguments of its fast, focused test selection
TARGETS: dict[str, list[str]] = {
    "metrics/diagonal.py": ["tests/metrics/test_diagonal_metrics.py", "tests/test_references.py", "tests/metrics/test_metrics.py", "tests/capture/test_noise.py",
                            "-k", "not scan_summary and not simulator"],
    "metrics/neighborhood.py": ["tests/metrics/test_neighborhood_metrics.py", "tests/test_references.py", "tests/metrics/test_metrics.py",
                                "-k", "not scan_summary and not simulator"],
    "metrics/slash.py": ["tests/metrics/test_slash_metrics.py", "tests/metrics/test_slash_tables.py", "tests/test_references.py",
                         "tests/metrics/test_metrics.py", "-k", "not scan_summary"],
    "metrics/rank.py": ["tests/metrics/test_rank.py", "tests/metrics/test_slash_tables.py", "tests/test_references.py",
                        "-k", "not scan_summary"],
    # without the tests of analysis/slash.py that scan a trained model first (20 s of fixture per mutant)
    "metrics/ropefit.py": ["tests/metrics/test_slash_tables.py", "tests/analysis/test_slash.py", "tests/test_references.py",
                           "-k", "not scan_summary and not rank_one_model_slash and not wrong_sign_would and not "
                           "band_usage_and_contributions and not slash_command_writes and not slash_dynamics"],
    "theory.py": ["tests/test_theory_direct.py", "tests/test_theory.py"],
    "simulator.py": ["tests/test_simulate_reference.py", "tests/test_simulate.py", "tests/test_references.py",
                     "-k", "not scan_summary and not demo and not reproduce and not cli"],
    # readings / analysis-slash: without the tests that scan a trained model first (20 s of fixture per mutant);
    # the hand-made scan of tests/analysis/test_slash.py reaches every function
    "analysis/slash.py": ["tests/analysis/test_slash.py", "tests/metrics/test_slash_tables.py",
                          "-k", "not rank_one_model_slash and not wrong_sign_would and not band_usage_and_contributions "
                          "and not slash_command_writes and not slash_dynamics"],
    "analysis/neighborhood.py": ["tests/analysis/test_neighborhood_analysis.py",
                                 "tests/analysis/test_neighborhood_plumbing.py", "tests/analysis/test_neighborhood.py",
                                 "tests/test_references.py", "-k", "not scan_summary"],
    # readings, one target per module of the package: the readings' own tests (hand-built summaries with numbers
    # on both sides of every threshold; the report's rendering tests reach every helper but take seconds each:
    # a run over 200 mutants took an hour with them)
    **{f"reporting/readings/{m}.py": ["tests/report/test_readings_kim.py", "tests/report/test_readings_commands.py",
                                      "tests/report/test_readings_helpers.py"]
       for m in ("common", "kim", "slash", "neighborhood", "commands", "findings")},
}

#: lines never mutated: text for people (error and warning messages), not science
DO_NOT_MUTATE_PATTERNS = [r"raise \w*Error\(", r"warnings\.warn\(", r"log\.\w+\("]

#: Survivors explained: ``(module glob, function regex, original-line regex, mutated-line regex, kind, reason)``
#: matched against ``mutmut show`` (first removed and first added line, whitespace stripped). Kinds:
#: ``equivalent`` (no input can tell the mutant from the original), ``cpu`` (device placement only:
#: identical on CPU, where the test suite runs; CI has no GPU), ``precision`` (a float32 instead of a
#: float64 intermediate, or the reverse: the same result unless values agree to float32 precision).
RULES: list[tuple[str, str, str, str, str, str]] = [
    ("*", "", r'float\("[-+]?(inf|nan)"\)', r'float\("[-+]?(INF|NAN)"\)', "equivalent",
     "float() reads 'inf' and 'nan' in any case"),
    ("*", "", r"\.sum\(.*dtype=torch\.float64\)", r"\.sum\((?!.*dtype=torch\.float64)", "equivalent",
     "a count of booleans or integers summed as int64 instead of float64, then added to a float64 "
     "accumulator: integer sums are exact, the value is the same"),
    ("metrics/neighborhood.py", "ordered_pair_counts", r"P = 1 << max\(1, \(T - 1\)", "", "equivalent",
     "pads to a larger power of two: the extra -inf entries take part in no pair"),
    ("metrics/neighborhood.py", "ordered_pair_counts", r"torch\.full\(\(N, P - T\)", r"dtype=None|^(?!.*dtype)",
     "equivalent", "-inf padding made in float32 is promoted by torch.cat to the row's dtype: still -inf"),
    ("metrics/neighborhood.py", "ordered_pair_counts", r"n = fin\.sum\(1\)\.to\(torch\.float64\)", r"to\(None\)",
     "precision", "n (n - 1) / 2 of int64 counts in the default float32: exact below 2^24 pairs per row"),
    ("metrics/neighborhood.py", "rising_pair_fraction", r"(hits|total) = torch\.zeros",
     r"dtype=None|^(?!.*dtype)", "precision", "float32 accumulators of counts: exact below 2^24 pairs per map"),
    ("metrics/neighborhood.py", "rising_pair_fraction", r"rows_per_chunk = max", "", "equivalent",
     "changes the chunk size only (the counts do not depend on it; tests run several chunk sizes)"),
    ("metrics/neighborhood.py", "rising_pair_fraction", r"for start in range\(0, T", r"range\(1, T",
     "equivalent", "row 0 sees at most one key, so it has no pair to count"),
    ("metrics/neighborhood.py", "rising_pair_fraction", r"K = min\(T, stop - 1 \+ extra\)", r"stop \+ 1",
     "equivalent", "reads two more key columns, which the visibility mask then excludes"),
    ("metrics/neighborhood.py", "rising_pair_fraction", r"out = hits / total", r"- torch\.where", "equivalent",
     "adds 0 or NaN; -NaN is NaN"),
    ("metrics/slash.py", "slash_profile|sink_weight", r"shape\[-1\]", r"shape\[-2\]", "equivalent",
     "attention maps are square [..., S, S]"),
    ("metrics/diagonal.py", "_slope_functional", r"nk\.clamp_min\(1\)", r"clamp_min\(2\)", "equivalent",
     "only diagonals with at least 3 entries get a weight; the clamp acts on counts 0 and 1 alone"),
    ("metrics/diagonal.py", "_groups", r"torch\.ones\(g\.shape\[0\], dtype=torch\.float64\)",
     r"torch\.ones\(g\.shape\[0\], \)|dtype=None", "equivalent",
     "all-one weights are exact in float32, and every user converts them to float64"),
    ("metrics/diagonal.py", "", r"S = m\.shape\[-1\]", r"shape\[-2\]", "equivalent", "score maps are square [S, S]"),
    ("metrics/diagonal.py", "diagonal_trend", r"\(~fin\)\.to\(torch\.int8\)", r"\.to\(None\)", "equivalent",
     "a stable sort of the booleans themselves gives the same order as of their int8 copy"),
    ("simulator.py", "auto_chunk", "", "", "equivalent",
     "sequences per compute chunk: speed and memory only (the results do not depend on chunking; tested)"),
    ("simulator.py", "_chunk_jobs", r"chunk = (cfg\.chunk_size or|max\(RNG_BLOCK)", "", "equivalent",
     "sequences per compute chunk: speed and memory only (the results do not depend on chunking; tested)"),
    ("metrics/rank.py", "band_contributions", r"half = rotary_dim // 2", r"rotary_dim / 2", "equivalent",
     "rotary_dim is even, and torch indexes with integral floats as with ints"),
    ("metrics/rank.py", "band_contributions", r"if dims else torch\.zeros", r"\(dims\) or True", "equivalent",
     "summing no dimensions of a float64 tensor gives the same float64 zeros"),
    ("metrics/rank.py", "rank_measures", r"n_e = \(p\.cumsum\(-1\) < energy - 1e-12\)", r"<= energy - 1e-12",
     "equivalent", "differs only when a cumulative share equals energy - 1e-12 to the last bit"),
    ("metrics/neighborhood.py", "rising_pair_fraction", r"m = m\.to\(torch\.float64\) if not", "", "equivalent",
     "integer and float32 entries compare exactly as they are: the float64 copy changes no comparison"),
    ("metrics/neighborhood.py", "adjacency_probability_score", r"m = m\.to\(torch\.float64\) if not",
     r"or True", "equivalent", "float32 -> float64 is exact: the same order, the same counts"),
    ("metrics/neighborhood.py", "adjacency_probability_score", r"if T >= 3 and|lower = torch\.ones",
     r"T > 3|T >= 4|bool\(None\)|lower = None|tril\(\+1\)", "equivalent",
     "only chooses between the merge count and the triple count, which give the same number "
     "(the test suite checks both against a loop); the merge path is still taken only for a finite lower triangle"),
    ("metrics/neighborhood.py", "adjacency_probability_score", r"return rising_pair_fraction", "", "equivalent",
     "None and the omitted defaults mean what False and 0.0 mean"),
    ("metrics/neighborhood.py", "rising_pair_fraction|adjacency_probability_score", r"T = m\.shape\[-1\]",
     r"shape\[-2\]", "equivalent", "maps are square [..., T, T]"),
    ("metrics/neighborhood.py", "aps_positions", r"if S <= max_positions", r"S < max_positions", "equivalent",
     "at S == max_positions the evenly spaced positions are 0 .. S-1 themselves"),
    ("metrics/neighborhood.py", "_rising_pairs_by_merge", r"total = float", r"\.to\(None\)", "equivalent",
     "/ is true division: the integer product gives the same float"),
    ("metrics/neighborhood.py", "norm_score", r"float64", r"\.to\(None\)|dtype=None|as_tensor\(norms, \)",
     "precision", "norms kept in their own dtype (a Python list: float32); the APS compares them as they are"),
    ("metrics/neighborhood.py", "_noninversions", r"while h < P and h <= _DIRECT_HALF", r"h < _DIRECT_HALF", "equivalent",
     "the direct comparison and the sorted-block count give the same count at every level; the threshold "
     "only picks the faster of the two"),
    ("metrics/neighborhood.py", "_noninversions", r"acc\.sum\(axis=1, dtype=np\.int64\)", r"dtype=None",
     "equivalent", "numpy sums an int16 array in the platform integer (int64), so the default dtype is int64"),
    ("metrics/neighborhood.py", "_rising_pairs_by_merge", r"w = min\(T, max\(_MIN_PREFIX, 1 << max\(1, ",
     r"2 << max\(1, |1 << max\(2, ", "equivalent",
     "a wider column prefix only adds -inf entries (keys the rows cannot see), which take part in no pair"),
    ("metrics/neighborhood.py", "rising_pair_counts", r'if x\.device\.type != "cpu"', r'"XXcpuXX"|"CPU"',
     "equivalent", "the device path (ordered_pair_counts, exact float64 counts) gives the same counts on the "
     "CPU; the test only picks numpy's faster sort there"),
    ("metrics/neighborhood.py", "theory_gap", r"cosine_map\.to\(torch\.float64\) - th", r"\.to\(None\)",
     "equivalent", "th (running_mean_cosine) is float64, so the difference is float64 either way"),
    ("metrics/neighborhood.py", "per_sequence_aps", r"\.to\(torch\.float32\)", r"\.to\(None\)", "precision",
     "cosines in the input's dtype instead of float32"),
    ("metrics/neighborhood.py", "rising_pair_fraction", r"hits = torch\.zeros", r"dtype=None", "precision",
     "float32 hit counts are exact below 2^24 pairs per map"),
    # readings / analysis-slash
    ("reporting/readings/commands.py", "sweep_readings", r"if dev < 0\.1 else", r"if dev <= 0\.1 else", "equivalent",
     "dev = |v - 0.5| of an APS v in [0, 1] is never exactly 0.1: v - 0.5 is exact for v in [0.25, 1] and "
     "0.5 +- fl(0.1) is no double (fl(0.1) has bits below 2^-53); for v < 0.25, dev > 0.25"),
    ("reporting/readings/*.py", "slash_readings|_slash_finding", r"if math\.isfinite\(base\) and base > 0",
     r"isfinite\(base\) or base > 0|base >= 0", "equivalent",
     "uniform_slash is NaN (no row reaches the offset) or positive, never 0: the guards agree on every value"),
    ("analysis/slash.py", "analyze_scans", r'if k not in \("layer", "head", "profile"\)', r"XXlayerXX|XXheadXX",
     "equivalent", "a decomposition row's layer and head are the head's own: copying them over changes nothing"),
    ("analysis/slash.py", "_profiles_figure", r"ax\.plot\(d, ", r"ax\.plot\((?!d, )", "equivalent",
     "matplotlib's default x is 0 .. n-1, which is d"),
    ("analysis/slash.py", "_profiles_figure", r"ax\.plot|set_title|legend\(",
     r'color=None|lw=None|ms=None|fontsize=None|\(layers from 0\)", \)|color="k", label=|"-", lw=1|\.tolist\(\), ms=3',
     "equivalent", "figure styling only (marker, colour, line width, font size): the same data drawn, no number stored"),
    # simulate / theory / metrics / analysis-neighborhood
    ("metrics/neighborhood.py", "_rising_pairs_by_merge", r"^lo = 0$", r"^lo = 1$", "equivalent",
     "row 0 sees no earlier key (every entry masked to -inf): it holds no pair to count"),
    ("metrics/neighborhood.py", "_rising_pairs_by_merge", r"count_ties=False", r"count_ties=(None|True)", "equivalent",
     "only the rising count (the first result) is read: None is False, and with ties counted the same rising "
     "count comes from the sorted-merge path instead of the direct comparison"),
    ("metrics/neighborhood.py", "ordered_pair_counts", r"b <= _DIRECT_BLOCK", r"b < _DIRECT_BLOCK", "equivalent",
     "skips the direct comparison of the smallest blocks: the sorted-merge path counts the same rising pairs "
     "(the tests compare both paths with loops)"),
    ("metrics/neighborhood.py", "ordered_pair_counts", r"^gt \+= \(blocks", r"^gt = \(blocks", "equivalent",
     "the direct comparison runs only at the first level (b = 1 = _DIRECT_BLOCK), while gt is still zero"),
    ("simulator.py", "run_simulation", r"acc = _new_accumulators\(cfg, dev\)", r"_new_accumulators\(cfg, None\)", "cpu",
     "accumulators on the default device (CPU) instead of the run's: the same tensors on CPU"),
    ("simulator.py", "_chunk_sums", r"sample_inputs\(cfg, first_block \+ i, dev, out=", r"first_block \+ i, out=", "cpu",
     "inputs drawn on the default device (CPU) instead of the run's: the same numbers on CPU"),
    ("simulator.py", "_masks", r"valid = torch\.ones\(S, S, dtype=torch\.bool, device=dev\)\.tril\(-1\) if cfg\.causal",
     r"\(cfg\.causal\) or True", "precision",
     "the early stop then checks only the lower triangle of a non-causal map: its scores are symmetric "
     "(Q = K) up to float32 rounding, so the largest standard error there is the whole map's to ~1e-6 relative"),
    ("simulator.py", "run_simulation", r"\.max\(\)\) < cfg\.target_stderr", r"<= cfg\.target_stderr", "equivalent",
     "differs only when the largest standard error equals the target to the last bit"),
    ("simulator.py", "forward_layers", r"if scale != 1\.0", r"scale != 2\.0", "equivalent",
     "multiplying by a scale of 1.0 is exact, and score_scale is 1, 1/sqrt(d) or 1/d, never 2"),
    ("simulator.py", "layer_buffers", r"dtype=dtype", r"dtype=None", "equivalent",
     "torch's default dtype is float32, the one dtype every caller asks for"),
    ("theory.py", "input_gram", r"alpha \* torch\.ones\(seq_len, seq_len", r"alpha / torch\.ones\(seq_len, seq_len",
     "equivalent", "alpha / 1 is alpha * 1"),
    ("theory.py", "input_gram", r"torch\.ones\(seq_len, seq_len,", r"torch\.ones\(seq_len, dtype", "equivalent",
     "a row of ones broadcast against the [N, N] identity gives the same [N, N] matrix"),
    ("theory.py", "_causal", r"n = S\.shape\[-1\]", r"shape\[(\+1|-2)\]", "equivalent",
     "the score matrices are square [N, N]"),
    ("theory.py", "kim_mean_field", r"torch\.softmax\(logits, dim=-1\)", r"dim=\+1", "equivalent",
     "the logits are one [N, N] matrix: dimension 1 is the last"),
    ("metrics/ropefit.py", r"(x\.)?RopeDecomposition\.band_usage", r"or 1\.0", r"or 2\.0", "equivalent",
     "the fallback divides only all-zero amplitudes: 0 / 1 = 0 / 2"),
    ("metrics/ropefit.py", r"(x\.)?RopeDecomposition\.band_peak_contribution|rope_decomposition",
     r"offs = torch\.arange\(S, dtype=torch\.float64\)", r"dtype=None|arange\(S, \)", "equivalent",
     "integer offsets: rank_one_logit converts them to float64, and int64 times float64 frequencies is the same float64"),
    ("metrics/ropefit.py", "rope_decomposition", r"phi = phi \+ \(math\.pi if sign < 0", r"phi - \(math\.pi|sign <= 0|sign < 1",
     "equivalent", "sign is -1 or +1 (so < 0, <= 0 and < 1 agree), and a phase of phi - pi is phi + pi: it is used only through cos"),
    ("metrics/ropefit.py", "rope_decomposition", r"bands = frequency_bands\(rotary_dim, base, S, theta=theta\)", "",
     "equivalent", "theta is always given here (the model's or inv_freq's), and frequency_bands then reads neither "
     "rotary_dim nor base"),
    ("metrics/ropefit.py", "causal_pair_mean|predicted_slash_profile", r"S - torch\.arange\(S, dtype=torch\.float64\)",
     r"dtype=None|arange\(S, \)", "equivalent",
     "integer counts S - d: float64 divided by or multiplied with int64 gives the same float64 (and w.sum() is exact)"),
    ("metrics/ropefit.py", "predicted_slash_profile", r"torch\.zeros\(\(\), dtype=p\.dtype\)", r"dtype=None|zeros\(\(\), \)",
     "equivalent", "a 0-dim zero does not promote torch.where's float64 result, and 0 is exact in any dtype"),
    ("metrics/ropefit.py", "rank_one_logit", r"\.sum\(-1\)", r"\.sum\(\+1\)", "equivalent",
     "the product is one [offsets, pairs] matrix: dimension 1 is the last"),
    ("metrics/diagonal.py", "window_view", r"m\.shape\[-1\]", r"shape\[(-2|\+1)\]", "equivalent",
     "maps are square in their last two dimensions, and callers pass [S, S] or [G, S, S] maps, whose "
     "dimension 1 has S entries too"),
    ("metrics/diagonal.py", "diagonal_means", r"torch\.zeros\(\(\), dtype=m\.dtype", r"dtype=None|zeros\(\(\), device",
     "equivalent", "a 0-dim zero does not promote torch.where's result, and 0 is exact in any dtype"),
    ("metrics/diagonal.py", "is_flat", r"\.abs\(\)\.max\(\) <= 1e-12 \* scale", r"< 1e-12 \* scale", "equivalent",
     "differs only when the largest deviation equals the tolerance to the last bit (a constant map gives 0 < tolerance)"),
    ("metrics/diagonal.py", "diagonal_trend", r"S = m\.shape\[-1\]", r"shape\[\+1\]", "equivalent",
     "diagonal_trend takes one [S, S] map (checked): dimension 1 is the last"),
    ("metrics/diagonal.py", "diagonal_trend", r"if S - first < 2", r"S \+ first < 2", "equivalent",
     "an early exit only: with fewer than two positions on any diagonal the general path counts no pair and "
     "returns None too (checked for S = 1 and 2)"),
    ("metrics/diagonal.py", "_entries", r"valid_mask\(S, include_diagonal, m\.device\)", r"include_diagonal, None\)", "cpu",
     "device placement only (a device argument dropped or set to None)"),
    ("analysis/neighborhood.py", "_bidirectional_capture", r"CaptureSpec\(num_layers=adapter\.num_layers\(cfg\)",
     r"^spec = CaptureSpec\(num_layers=None, num_heads=adapter\.num_heads\(cfg\),$", "equivalent",
     "the control's capture records no layer, and the attention function never reads num_layers (only a scan's "
     "finalize step does)"),
    ("analysis/neighborhood.py", "build_summary", r'T = causal\["cosine"\]\.shape\[-1\]', r"shape\[-2\]", "equivalent",
     "the mean cosine maps are square [K, T, T]"),
    ("analysis/neighborhood.py", "layer_rows", r"if n > 1 else float\(\"nan\"\)", r"if n >= 1 else", "equivalent",
     "torch's unbiased std of a single value is NaN as well (with a warning): the same value"),
    ("analysis/neighborhood.py", "use_poslens_attention", r'getattr\(model\.config, "_attn_implementation", None\) != ATTN_NAME',
     r'getattr\(None, "_attn_implementation", None\) != ATTN_NAME', "equivalent",
     "the check only skips a redundant call: setting the attention implementation the model already uses "
     "changes nothing"),
    ("analysis/neighborhood.py", "run_neighborhood", r"^convention=LAYER_CONVENTION\)$", r"^(convention=None)?\)$",
     "equivalent", "the summary carries layer_convention = LAYER_CONVENTION (build_summary), which write_summary's "
     "envelope uses when no convention is passed"),
]

#: figure functions whose matplotlib styling keywords (below) change no number a reader reads
STYLED_FIGURES: dict[str, str] = {"analysis/neighborhood.py": "neighborhood_figures"}
#: keywords that style what is drawn: size of the figure or caps, marker, line width, colour, transparency, font size
#: (not ``ls``: the line style is what tells causal from bidirectional in the figures; the APS panel's markers,
#: which tell head outputs from the residual stream, are checked by the tests, so none of them survives)
STYLE_KWARGS = ("figsize", "capsize", "marker", "ms", "lw", "color", "alpha", "fontsize")
_STYLE_KW = re.compile(r"\b(?:%s)=(?:\([^()]*\)|\"[^\"]*\"|'[^']*'|[\w.+-]+)" % "|".join(STYLE_KWARGS))


def _styling_only(module: str, func: str, minus: str, plus: str) -> bool:
    """Whether a mutant of a figure function changes (or drops) only styling keywords of one call."""
    fn = STYLED_FIGURES.get(module)
    if not fn or not re.fullmatch(fn, func) or minus == plus:
        return False
    return re.sub(r"[\s,]", "", _STYLE_KW.sub("", minus)) == re.sub(r"[\s,]", "", _STYLE_KW.sub("", plus))



#: modules whose sentences (readings, error messages, captions) a mutant that only rewords one is
#: counted apart ("text"): every target (lines raising errors are not mutated at all)
PROSE = "*"
_STRING = re.compile(r"""(?P<q>["'])(?P<s>(?:\\.|(?!(?P=q)).)*)(?P=q)""")
_FIELD = re.compile(r"\{[^{}]*\}")  # a replacement field of an f-string (or of str.format)


def _prose_only(minus: str, plus: str) -> bool:
    """Whether ``plus`` differs from ``minus`` only inside string literals that hold a space."""
    a, b = _STRING.split(minus), _STRING.split(plus)
    if len(a) != len(b):
        return False
    changed = [(x, y) for x, y in zip(a, b) if x != y]
    if not changed:
        return False
    lits_a = [m.group("s") for m in _STRING.finditer(minus)]
    lits_b = [m.group("s") for m in _STRING.finditer(plus)]
    code_a, code_b = _STRING.sub("S", minus), _STRING.sub("S", plus)
    # an f-string's replacement fields are code: a literal whose {...} changed is not rewording
    return code_a == code_b and all(" " in x and _FIELD.findall(x) == _FIELD.findall(y)
                                    for x, y in zip(lits_a, lits_b) if x != y)


def _without_device(line: str) -> str:
    line = re.sub(r"\.to\((None|[\w.]+\.device)\)", "", line)
    line = re.sub(r"device=(None|[\w.]+)", "", line)
    line = re.sub(r"\b\w+\.device\b", "", line)  # a positional device argument
    return re.sub(r"[\s,]", "", line)


def explain(module: str, func: str, minus: str, plus: str) -> tuple[str, str] | None:
    """``(kind, reason)`` of the first rule matching a survivor, else None."""
    if "device" in minus and _without_device(minus) == _without_device(plus):
        return "cpu", "device placement only (a device argument dropped or set to None)"
    if _styling_only(module, func, minus, plus):
        return "equivalent", "figure styling only (size, caps, marker, line width, colour, font size): the same data drawn"
    if fnmatch.fnmatch(module, PROSE) and _prose_only(minus, plus):
        return "text", "the wording of a sentence for people (a literal with a space in it), no number or branch"
    for mod_glob, func_re, from_re, to_re, kind, reason in RULES:
        if (fnmatch.fnmatch(module, mod_glob) and re.fullmatch(func_re or ".*", func)
                and re.search(from_re, minus) and re.search(to_re, plus)):
            return kind, reason
    return None


def selection(module: str) -> list[str]:
    """``TARGETS[module]`` with each test file found wherever it now lives under tests/ (the test tree
    mirrors the package and files move with it)."""
    out = []
    for arg in TARGETS[module]:
        if arg.startswith("tests/") and not (ROOT / arg).exists():
            found = sorted((ROOT / "tests").rglob(Path(arg).name))
            if found:
                arg = str(found[0].relative_to(ROOT))
        out.append(arg)
    return out


def slug(module: str) -> str:
    return module.replace("/", "__").removesuffix(".py")


def prepare(module: str) -> Path:
    """Refresh the scratch project of ``module`` (keeping mutmut's cache of results)."""
    work = WORK / slug(module)
    work.mkdir(parents=True, exist_ok=True)
    for name in ("src", "tests"):
        shutil.rmtree(work / name, ignore_errors=True)
        shutil.copytree(ROOT / name, work / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # mutmut copies the project into mutants/ only where a file is absent there: drop every copy but
    # the target's own (whose results cache is the .meta beside it) so that changed code is seen
    target = Path("src/poslens") / module
    mutated = work / "mutants"
    if (mutated / "src").exists():
        for p in sorted((mutated / "src").rglob("*"), reverse=True):
            rel = p.relative_to(mutated)
            if p.is_file() and not str(rel).startswith(str(target)):
                p.unlink()
    shutil.rmtree(mutated / "tests", ignore_errors=True)
    text = (ROOT / "pyproject.toml").read_text()
    text += "\n[tool.mutmut]\n" + "\n".join([
        'source_paths = ["src/"]',
        f'only_mutate = ["{target}"]',
        f"pytest_add_cli_args_test_selection = {json.dumps(selection(module))}",
        'pytest_add_cli_args = ["-p", "no:cacheprovider"]',
        f"do_not_mutate_patterns = {json.dumps(DO_NOT_MUTATE_PATTERNS)}",
        'process_isolation = "forkserver"',
        "use_git_change_detection = false",
        "timeout_multiplier = 10.0",
    ]) + "\n"
    (work / "pyproject.toml").write_text(text)
    return work


def mutmut(work: Path, *args: str, capture: bool = True) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)  # the mutated copy must be the only poslens on the path
    r = subprocess.run([sys.executable, "-m", "mutmut", *args], cwd=work, env=env, text=True,
                       stdout=subprocess.PIPE if capture else None, stderr=subprocess.STDOUT if capture else None)
    if r.returncode != 0:
        raise SystemExit(f"mutmut {' '.join(args)} failed in {work} (exit {r.returncode})"
                         + (f":\n{r.stdout[-3000:]}" if capture else ""))
    return r.stdout or ""


def mutant_names(work: Path, module: str) -> tuple[list[str], dict[str, str]]:
    """Every mutant mutmut makes of ``module`` (as ``poslens.<module>.x_<function>__mutmut_<n>``) and
    the hash of each mutated function's source (mutmut's own)."""
    code = ("import json, sys; from mutmut.mutation.file_mutation import mutate_file_contents as m; "
            "p = sys.argv[1]; f = m(p, open(p).read()); "
            "print(json.dumps([list(f.mutant_names), dict(f.hash_by_function_name)]))")
    r = subprocess.run([sys.executable, "-c", code, f"src/poslens/{module}"], cwd=work, text=True,
                       capture_output=True, check=True)
    names, hashes = json.loads(r.stdout.strip().splitlines()[-1])
    prefix = "poslens." + module.removesuffix(".py").replace("/", ".") + "."
    return [prefix + n.replace("__init__.", "") for n in names], hashes


def _meta(work: Path, module: str) -> dict:
    meta = work / "mutants" / "src" / "poslens" / (module + ".meta")
    return json.loads(meta.read_text()) if meta.exists() else {}


def _function_of(name: str) -> str:
    """``x_<function>`` (mutmut's key of the function) of a mutant name."""
    return re.sub(r"__mutmut_\d+$", "", name.rsplit(".", 1)[-1])


def statuses(work: Path, module: str) -> dict[str, int]:
    """mutant name -> mutmut exit code, from the target's .meta file."""
    meta = work / "mutants" / "src" / "poslens" / (module + ".meta")
    return json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}


def diffs_of(work: Path, module: str, names: list[str]) -> dict[str, tuple[str, str, str]]:
    """mutant name -> ``(function, removed line, added line)`` (first changed line of each), read by
    mutmut's own diff in one process."""
    if not names:
        return {}
    code = ("import json, sys; from mutmut.mutation.diff_apply import get_diff_for_mutant as d; "
            "p = sys.argv[1]; print(json.dumps({n: d(n, path=p) for n in sys.argv[2:]}))")
    r = subprocess.run([sys.executable, "-c", code, f"src/poslens/{module}", *names], cwd=work, text=True,
                       capture_output=True, check=True)
    out = {}
    for name, diff in json.loads(r.stdout.strip().splitlines()[-1]).items():
        lines = diff.splitlines()
        minus = next((ln[1:].strip() for ln in lines if ln.startswith("-") and not ln.startswith("---")), "")
        plus = next((ln[1:].strip() for ln in lines if ln.startswith("+") and not ln.startswith("+++")), "")
        func = re.sub(r"__mutmut_\d+$", "", name.rsplit(".", 1)[-1]).removeprefix("x_")
        out[name] = (func.replace("ǁ", "."), minus, plus)  # methods are named x_Class_ǁmethod by mutmut
    return out


# mutmut's exit codes of a mutant that no selected test noticed (survived; no test reaches it)
SURVIVED = {0, 5}
NO_TESTS = {33}
#: statuses (mutmut.stats.status_by_exit_code) that count as caught: a test failed, the run ran past
#: its time limit, or it crashed (SIGKILL after the CPU limit reads as "segfault")
CAUGHT = ("killed", "timeout", "segfault")


def summarize(module: str, work: Path, sampled_of: int = 0, only: set[str] | None = None) -> dict:
    """Counts, score and survivors of ``module`` (of the mutants in ``only``, a seeded sample, if given)."""
    from mutmut.stats import status_by_exit_code  # noqa: PLC0415 (only where mutmut is installed)

    codes = {n: c for n, c in statuses(work, module).items() if c is not None and (only is None or n in only)}
    by_status: dict[str, list[str]] = {}
    for name, code in codes.items():
        by_status.setdefault(status_by_exit_code.get(code, f"exit {code}"), []).append(name)
    survivors, equivalent = [], []
    names = sorted(by_status.get("survived", []) + by_status.get("no tests", []),
                   key=lambda n: (n.rsplit("__mutmut_", 1)[0], int(n.rsplit("_", 1)[1])))
    diffs = diffs_of(work, module, names)
    for name in names:
        func, minus, plus = diffs[name]
        why = explain(module, func, minus, plus)
        entry = {"mutant": name, "function": func, "from": minus, "to": plus}
        if why:
            equivalent.append({**entry, "kind": why[0], "reason": why[1]})
        else:
            survivors.append(entry)
    killed = sum(len(by_status.get(k, [])) for k in CAUGHT)
    n = len(codes)
    judged = n - len(equivalent)
    return {"mutants": n, "killed": killed, "survived": len(survivors), "equivalent": len(equivalent),
            "other": {k: len(v) for k, v in by_status.items() if k not in (*CAUGHT, "survived", "no tests")},
            "score": killed / judged if judged else None, "raw_score": killed / n if n else None,
            "tests": selection(module), "survivors": survivors, "equivalent_survivors": equivalent,
            "sampled_of": sampled_of if n < sampled_of else 0}


def reexplain(module: str, r: dict) -> dict:
    """A stored result with every survivor judged again by the current rules (the killed count is
    the run's own; only which survivors count as explained can change)."""
    survivors, equivalent = [], []
    for e in r["survivors"] + r["equivalent_survivors"]:
        entry = {k: e[k] for k in ("mutant", "function", "from", "to")}
        why = explain(module, e["function"], e["from"], e["to"])
        (equivalent.append({**entry, "kind": why[0], "reason": why[1]}) if why else survivors.append(entry))
    judged = r["mutants"] - len(equivalent)
    return {**r, "survived": len(survivors), "equivalent": len(equivalent), "survivors": survivors,
            "equivalent_survivors": equivalent, "score": r["killed"] / judged if judged else None}


KINDS = ("equivalent", "cpu", "precision", "text")


def _score_cell(r: dict, judged: int) -> str:
    """The score, with its binomial standard error ``sqrt(p (1 - p) / n)`` (n = the sampled mutants
    that can be wrong) where the module was measured on a random sample."""
    p = r["score"] or 0.0
    if not r.get("sampled_of") or judged <= 0:
        return f"{100 * p:.1f} %"
    if p == 1.0:  # no miss in n: the rule of three bounds the miss rate below 3 / n (95 %)
        return f"100.0 % (≥ {100 * (1 - 3 / judged):.1f} %)"
    return f"{100 * p:.1f} % ± {100 * (p * (1 - p) / judged) ** 0.5:.1f}"


def table(results: dict) -> str:
    """Markdown table: per module the mutants run, killed, unexplained survivors, explained survivors
    by kind, the score over the mutants that can be wrong (killed / (mutants - explained)) and the
    raw score (killed / mutants)."""
    head = "| module | mutants | killed | survived | " + " | ".join(KINDS) + " | score | raw |"
    rows = [head, "|---|" + "---:|" * (5 + len(KINDS))]
    tot = {k: 0 for k in ("mutants", "killed", "survived", *KINDS)}
    for m, r in results.items():
        kinds = {k: sum(e.get("kind", "equivalent") == k for e in r["equivalent_survivors"]) for k in KINDS}
        vals = {"mutants": r["mutants"], "killed": r["killed"], "survived": r["survived"], **kinds}
        tot = {k: tot[k] + vals[k] for k in tot}
        sample = f" (of {r['sampled_of']})" if r.get("sampled_of") else ""
        rows.append(f"| `{m}`{sample} | " + " | ".join(str(vals[k]) for k in tot)
                    + f" | {_score_cell(r, r['mutants'] - sum(kinds.values()))} | {100 * (r['raw_score'] or 0):.1f} % |")
    judged = tot["mutants"] - sum(tot[k] for k in KINDS)
    rows.append("| all | " + " | ".join(str(v) for v in tot.values())
                + f" | {100 * tot['killed'] / max(judged, 1):.1f} % | {100 * tot['killed'] / max(tot['mutants'], 1):.1f} % |")
    return "\n".join(rows)


#: what the numbers of a module do not say by themselves (how the last runs went)
NOTES: dict[str, str] = {
    "metrics/neighborhood.py": (
        "A seeded sample of 150 of the 798 mutants. First pass 123 of 135 judged killed (91.1 % ± 2.4). Tests "
        "kill five survivors (counts above 2^24 accumulated in float32 in `ordered_pair_counts` and "
        "`_rising_pairs_by_merge`, checked on a 12,000-entry permutation against a Fenwick-tree count and a "
        "600-position map against a numpy per-row count; the tie-free torch path run on the CPU; values 1e-9 "
        "apart, which an added constant would merge into ties) and rules explain seven (a wider column prefix of "
        "-inf keys, the direct/sorted threshold, numpy's int16 sum in int64, the device switch between two exact "
        "counts, a float64 difference either way)."),
    "metrics/diagonal.py": (
        "A seeded sample of 200 of the 929 mutants. First pass: 13 unexplained survivors (`causal_view` and "
        "`window_view`, a flatness p-value from two entries, non-relativity on the main diagonal, the noise "
        "correction with two groups, the scale of `is_flat`'s exact-constant check); tests against loops and "
        "hand-counted sign-flip p-values (2/256, 4/256) kill every one."),
    "analysis/slash.py": (
        "A seeded sample of 200 of the 995 mutants (first pass 168 of 197 judged, 85 %), on "
        "`tests/analysis/test_slash.py` without its trained-model fixture (a hand-made scan directory reaches "
        "every step of `run_slash`) and `tests/metrics/test_slash_tables.py`."),
    "analysis/neighborhood.py": (
        "A seeded sample of 300 of the 772 mutants (first pass on the second 150: 132 of 138 judged, "
        "95.7 % ± 1.7), on `tests/analysis/test_neighborhood_plumbing.py` among others: the summary's keys and "
        "per-layer numbers against the per-sequence scores written beside it, table cells worked out by hand, "
        "config.json, each option's error message, the loader options, the figure's lines, error bars, labels, "
        "limits and panels read from the figure objects. Styling keywords of the figure (size, caps, marker, "
        "line width, transparency, font size) are explained as such; the line style is not (it tells causal "
        "from bidirectional), nor the APS panel's markers, which tests check."),
    "metrics/rank.py": ("Every mutant (a full run), of the module with `.to(torch.float64)` where it has "
                        "`torch.as_tensor(x, dtype=torch.float64)`; `python benchmarks/mutation.py metrics/rank.py` "
                        "refreshes it."),
    "simulator.py": (
        "A seeded sample of 220 of the 1,104 mutants. First pass: 26 unexplained survivors; tests of the run "
        "directory with figures and its metadata, the round trip, the layer convention, the thread bound, the "
        "buffers and the summary's group weights kill them, or rules explain them."),
    "theory.py": "Every mutant (a full run, not a sample).",
    "metrics/ropefit.py": (
        "Every mutant (a full run), with a focused selection that leaves out the tests of analysis/slash.py that "
        "scan a trained model (20 s of fixture per mutant). First pass: 19 unexplained survivors (the "
        "rotary-dimension checks, `attention_scaling`, the zero-signal and zero-key guards of the fit, sign and "
        "coherence, a fitted coefficient below 1, empty bands in `band_peak_contribution`); tests kill every one."),
}


def _cell(code: str) -> str:
    return code.replace("|", "\\|")


def write_doc(results: dict) -> None:
    lines = ["# Mutation testing", "",
             "Generated by `python benchmarks/mutation.py --report --doc` from the results of",
             "[mutmut](https://pypi.org/project/mutmut/) 3 runs, one module at a time, each with its focused",
             "test selection (`python benchmarks/mutation.py --list`); see the script's docstring.",
             "",
             "- A mutant is *killed* when a selected test fails, times out or crashes.",
             "- A surviving mutant is *explained* by a rule in `benchmarks/mutation.py` (`RULES`), of one of",
             "  four kinds: `equivalent` (no input can tell it from the original), `cpu` (device placement",
             "  only: identical on CPU, where the suite runs; CI has no GPU), `precision` (a float32",
             "  intermediate instead of float64 or the reverse: the same result unless values agree to",
             "  float32 precision), `text` (rewords a sentence for people; no number or branch).",
             "- *score* = killed / (mutants − explained); *raw* = killed / mutants.",
             "- A module marked *(of N)* was measured on part of its N mutants: a random sample (seed 0,",
             "  `--sample`) because the machine is shared, so the score is an estimate; its cell gives the",
             "  binomial standard error ±100·sqrt(p(1−p)/n) % (n = sampled mutants less the explained ones)",
             "  or, where no judged mutant survived, the rule of three's 95 % lower bound 100·(1 − 3/n) %.",
             "  A sample's unexplained survivors are rerun after new tests (`--rerun-survivors`), so the",
             "  score is the sample's after the tests written for it: optimistic as an estimate for the",
             "  whole module (the first pass, given in the notes where it differs, is the unbiased one).",
             "", table(results), ""]
    notes = [f"- `{m}`: {NOTES[m]}" for m in results if m in NOTES]
    if notes:
        lines += ["Notes:", "", *notes, ""]
    for m, r in results.items():
        if r["equivalent_survivors"]:
            lines += [f"## `{m}`: equivalent mutants", "", "| function | original | mutated | kind | why it is not a wrong result |",
                      "|---|---|---|---|---|"]
            for e in r["equivalent_survivors"]:
                lines.append(f"| `{e['function']}` | `{_cell(e['from'])}` | `{_cell(e['to'])}` | {e['kind']} | {e['reason']} |")
            lines.append("")
        if r["survivors"]:
            lines += [f"## `{m}`: surviving mutants not (yet) explained", "", "| function | original | mutated |",
                      "|---|---|---|"]
            for e in r["survivors"]:
                lines.append(f"| `{e['function']}` | `{_cell(e['from'])}` | `{_cell(e['to'])}` |")
            lines.append("")
    DOC.write_text("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("modules", nargs="*", help="targets (paths under src/poslens); default: all")
    ap.add_argument("--list", action="store_true", help="print the targets and their test selections")
    ap.add_argument("--max-children", type=int, default=1, help="parallel mutant workers (the machine is shared)")
    ap.add_argument("--rerun-survivors", action="store_true",
                    help="test the survivors of the last run again (after new tests were written)")
    ap.add_argument("--sample", type=int, default=0,
                    help="run only a seeded random sample of this many mutants per module (0 = all): an estimate")
    ap.add_argument("--report", action="store_true", help="only read the cached results back, run nothing")
    ap.add_argument("--doc", action="store_true", help=f"also write {DOC.relative_to(ROOT)}")
    a = ap.parse_args(argv)
    if a.list:
        for m, t in TARGETS.items():
            print(f"{m:28s} {' '.join(selection(m))}")
        return 0
    modules = a.modules or list(TARGETS)
    unknown = [m for m in modules if m not in TARGETS]
    if unknown:
        ap.error(f"unknown target(s) {unknown}; see --list")
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results = {m: r for m, r in results.items() if m in TARGETS and "equivalent" in r}
    for mod in modules:
        work = WORK / slug(mod)
        if not a.report:
            old = _meta(work, mod)
            codes, old_hashes = old.get("exit_code_by_key", {}), old.get("hash_by_function_name", {})
            work = prepare(mod)
            names, hashes = mutant_names(work, mod)
            changed = {f for f, h in hashes.items() if old_hashes.get(f) != h}  # mutants renumbered: run again
            if a.sample and a.sample < len(names):
                names = sorted(random.Random(0).sample(names, a.sample))
            todo = [n for n in names if codes.get(n) is None or _function_of(n) in changed
                    or (a.rerun_survivors and codes[n] in SURVIVED | NO_TESTS)]
            print(f"== {mod}: {len(todo)} of {len(names)} mutants to run ({' '.join(selection(mod))})", flush=True)
            if todo:
                mutmut(work, "run", "--max-children", str(a.max_children), *todo, capture=False)
            # mutmut drops cached results when the test selection or the module changed: run what lost them
            missing = [n for n in names if statuses(work, mod).get(n) is None]
            if missing:
                print(f"== {mod}: {len(missing)} mutants without a result, run again", flush=True)
                mutmut(work, "run", "--max-children", str(a.max_children), *missing, capture=False)
        else:
            if not work.exists():  # never run here: the results file's counts, its survivors judged again
                if mod in results:
                    results[mod] = reexplain(mod, results[mod])
                    print(f"{mod}: no scratch project (not run here); survivors of the results file judged again")
                continue
            names, _ = mutant_names(work, mod)
            if a.sample and a.sample < len(names):
                names = sorted(random.Random(0).sample(names, a.sample))
        if not statuses(work, mod):
            print(f"{mod}: no results (run it first)")
            continue
        results[mod] = summarize(mod, work, len(statuses(work, mod)), only=set(names) if a.sample else None)
        RESULTS.write_text(json.dumps({m: results[m] for m in TARGETS if m in results}, indent=1) + "\n")
        for s in results[mod]["survivors"]:
            print(f"  SURVIVED {mod} {s['function']}: {s['from']}  ->  {s['to']}")
    results = {m: results[m] for m in TARGETS if m in results}
    print(table(results))
    if a.doc:
        write_doc(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
