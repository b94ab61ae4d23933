"""What a user of ``poslens neighborhood`` (arXiv 2501.00073) reads, checked against values computed
here: the summary's keys and per-layer numbers (from the per-sequence scores written beside it), the
table cells, the written config and command, the options' error messages, ``--overwrite``, the data
sources (random tokens need no tokenizer, text goes through the model's tokenizer, ``--chars``), the
progress updates, and the figure's data (lines, error bars, labels, axes; not pixels)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import statistics
import types
from pathlib import Path

import pytest
import torch

from archs import V, save_tiny
from poslens.analysis import neighborhood as nb
from poslens.analysis.neighborhood import (CharSource, NeighborhoodConfig, build_summary, layer_rows,
                                           neighborhood_figures)
from poslens.errors import PoslensError

MODES = ("causal", "bidirectional")


# --------------------------------------------------------------------------------------------
# hand-made per-sequence results: build_summary, layer_rows and the figures without a model
# --------------------------------------------------------------------------------------------
def _t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def _results(aps, ns, raps, rns, T=5, seed=0):
    """A measured dict as measure_neighborhood returns it, from per-sequence rows ``[K][N]``."""
    g = torch.Generator().manual_seed(seed)
    K = len(aps)
    return {"aps": _t(aps), "norm_score": _t(ns), "resid_aps": _t(raps), "resid_norm_score": _t(rns),
            "cosine": torch.rand(K, T, T, generator=g, dtype=torch.float64),
            "norms": torch.rand(K, T, generator=g, dtype=torch.float64),
            "resid_cosine": torch.rand(K, T, T, generator=g, dtype=torch.float64),
            "resid_norms": torch.rand(K, T, generator=g, dtype=torch.float64)}


# three sequences per layer, chosen so that mean and sample std are round: (0.5, 0.7, 0.9) -> 0.7 ± 0.2
CAUSAL = _results(aps=[[0.5, 0.7, 0.9], [0.2, 0.4, 0.6], [0.1, 0.1, 0.4]],
                  ns=[[0.3, 0.3, 0.3], [0.6, 0.8, 1.0], [0.0, 0.5, 1.0]],
                  raps=[[0.55, 0.65, 0.75], [0.75, 0.75, 0.75], [0.3, 0.5, 0.7]],
                  rns=[[0.1, 0.2, 0.3], [0.9, 0.9, 0.9], [0.4, 0.4, 0.4]])
BID = _results(aps=[[0.4, 0.5, 0.6], [0.45, 0.5, 0.55], [0.2, 0.3, 0.4]],
               ns=[[0.7, 0.8, 0.9], [0.1, 0.3, 0.5], [0.25, 0.25, 0.25]],
               raps=[[0.5, 0.5, 0.5], [0.6, 0.6, 0.6], [0.7, 0.7, 0.7]],
               rns=[[0.2, 0.2, 0.2], [0.3, 0.3, 0.3], [0.4, 0.4, 0.4]], seed=1)


def test_summary_tables_and_keys_by_hand():
    cfg = NeighborhoodConfig(model_dir="/models/tiny-rope", out="/tmp/unused")
    s = build_summary({"causal": CAUSAL, "bidirectional": BID}, cfg=cfg, pe="rope", model_type="llama", num_seqs=3,
                      source={"kind": "random"})
    assert s["experiment"] == "neighborhood" and s["paper"] == "neighborhood"
    assert s["model_dir"] == "/models/tiny-rope" and s["pe"] == "rope" and s["model_type"] == "llama"
    assert "rope PE" in s["title"] and "tiny-rope" in s["title"] and "llama" not in s["title"]  # named, not by type
    assert s["num_seqs"] == 3 and s["seq_len"] == 5 and s["source"] == {"kind": "random"}
    assert s["modes"] == ["causal", "bidirectional"] and s["layer_convention"] == nb.LAYER_CONVENTION
    # per layer: means and sample standard deviations worked out by hand from the rows above
    want = [  # aps mean, std; norm score mean, std; resid aps mean, std; resid norm mean; bid aps mean, std; bid ns
        (0.7, 0.2, 0.3, 0.0, 0.65, 0.1, 0.2, 0.5, 0.1, 0.8),
        (0.4, 0.2, 0.8, 0.2, 0.75, 0.0, 0.9, 0.5, 0.05, 0.3),
        (0.2, math.sqrt(0.03), 0.5, 0.5, 0.5, 0.2, 0.4, 0.3, 0.1, 0.25),
    ]
    keys = ("aps_mean", "aps_std", "norm_score_mean", "norm_score_std", "resid_aps_mean", "resid_aps_std",
            "resid_norm_score_mean", "bidirectional_aps_mean", "bidirectional_aps_std", "bidirectional_norm_score_mean")
    assert [l["layer"] for l in s["layers"]] == ["embeddings", 0, 1]
    for layer, w in zip(s["layers"], want):
        for key, v in zip(keys, w):
            assert layer[key] == pytest.approx(v, abs=1e-12), key
    assert "token embeddings" in s["layers"][0]["vectors"] and "head outputs" in s["layers"][1]["vectors"]
    t = s["tables"][0]
    assert t["columns"][0] == "layer" and len(t["columns"]) == 6 and t["note"] == nb.LAYER_CONVENTION
    assert t["rows"] == [  # a std of exactly 0 reads "± 0"
        ["embeddings", "0.7 ± 0.2", "0.3 ± 0", "0.65 ± 0.1", "0.5 ± 0.1", "0.8 ± 0.1"],
        [0, "0.4 ± 0.2", "0.8 ± 0.2", "0.75 ± 0", "0.5 ± 0.05", "0.3 ± 0.2"],
        [1, "0.2 ± 0.173", "0.5 ± 0.5", "0.5 ± 0.2", "0.3 ± 0.1", "0.25 ± 0"],
    ]
    assert "readings" not in s and s["judgement"]["layer"] == 0 and s["judgement"]["aps"] == pytest.approx(0.4)
    one = build_summary({"causal": CAUSAL})
    assert one["model_dir"] is None and one["modes"] == ["causal"] and len(one["tables"][0]["columns"]) == 4
    assert one["pe"] == one["model_type"] == "?" and "(? PE, ?)" in one["title"]  # not given: unknown
    assert [r[1] for r in one["tables"][0]["rows"]] == ["0.7 ± 0.2", "0.4 ± 0.2", "0.2 ± 0.173"]
    assert not any(k.startswith("bidirectional") for k in one["layers"][0])


def test_theory_gap_reads_decoder_layer_0_and_needs_one():
    """The summary's theory gap: mean |cos - sqrt(min(i, j) / max(i, j))| below the diagonal of decoder
    layer 0's map (tensor index 1); a model with no decoder layer has none."""
    T = 5
    theory = [[math.sqrt(min(i, j) / max(i, j)) for j in range(1, T + 1)] for i in range(1, T + 1)]
    two = _results([[0.5, 0.6]] * 2, [[0.5, 0.6]] * 2, [[0.5, 0.6]] * 2, [[0.5, 0.6]] * 2, T=T)
    cos1 = _t(theory)
    for i in range(T):
        for j in range(i):
            cos1[i, j] += 0.1 if (i + j) % 2 else -0.3
    two["cosine"][1] = cos1
    diffs = [0.1 if (i + j) % 2 else 0.3 for i in range(T) for j in range(i)]
    s = build_summary({"causal": two})
    assert s["theory_gap_layer0"] == pytest.approx(sum(diffs) / len(diffs), abs=1e-12)
    emb_only = {k: v[:1] for k, v in two.items()}
    assert math.isnan(build_summary({"causal": emb_only})["theory_gap_layer0"])


def test_layer_rows_with_two_sequences_have_a_std():
    rows = layer_rows({"aps": _t([[0.2, 0.6]]), "norm_score": _t([[1.0, 0.0]])})
    assert rows[0]["aps_mean"] == pytest.approx(0.4) and rows[0]["aps_std"] == pytest.approx(0.4 / math.sqrt(2))
    assert rows[0]["norm_score_std"] == pytest.approx(1 / math.sqrt(2))


def _lines(ax):
    """The data lines of ``ax`` (not the 0.5 reference line), by label."""
    return {l.get_label(): l for l in ax.get_lines() if not l.get_label().startswith("_")}


def test_aps_figure_data_by_hand():
    figs = neighborhood_figures({"causal": CAUSAL, "bidirectional": BID}, title="tiny")
    assert [f[0] for f in figs] == ["cosine_maps.png", "cosine_maps_bidirectional.png", "aps_by_layer.png"]
    assert all(cap for _, _, cap in figs)
    name, fig, caption = figs[2]
    assert "error bars = std over sequences" in caption
    axes = fig.axes
    assert len(axes) == 2
    left_box, right_box = axes[0].get_position(), axes[1].get_position()  # the caption says left and right
    assert left_box.x1 <= right_box.x0 and left_box.y0 == pytest.approx(right_box.y0)
    assert "tiny" in fig.get_suptitle() and "adjacency" in fig.get_suptitle()
    x = [-1, 0, 1]  # the embeddings, then decoder layers from 0
    for ax, ylabel in zip(axes, ("APS", "norm score")):
        assert ax.get_ylabel() == ylabel and "−1: embeddings" in ax.get_xlabel()
        assert ax.get_ylim() == pytest.approx((-0.02, 1.02))
        ref = [l for l in ax.get_lines() if list(l.get_ydata()) == [0.5, 0.5]]
        assert len(ref) == 1  # the chance level
        ticks = ax.xaxis.get_major_locator()()
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks)  # layers are whole numbers
    # the head-output APS is an error-bar plot (its data line sits in the container), the rest plain lines
    bars = {c.get_label(): c for c in axes[0].containers}
    assert sorted(bars) == ["head outputs, bidirectional", "head outputs, causal"]
    left = {**_lines(axes[0]), **{k: c.lines[0] for k, c in bars.items()}}
    right_lines = _lines(axes[1])
    assert sorted(_lines(axes[0])) == ["residual, bidirectional", "residual, causal"]
    assert sorted(right_lines) == ["head outputs, bidirectional", "head outputs, causal"]
    assert sorted(t.get_text() for t in axes[0].get_legend().get_texts()) == sorted(left)
    hand = {  # per layer means of the rows above: head-output APS, residual APS, norm score
        "causal": ([0.7, 0.4, 0.2], [0.65, 0.75, 0.5], [0.3, 0.8, 0.5]),
        "bidirectional": ([0.5, 0.5, 0.3], [0.5, 0.6, 0.7], [0.8, 0.3, 0.25]),
    }
    stds = {"causal": [0.2, 0.2, math.sqrt(0.03)], "bidirectional": [0.1, 0.05, 0.1]}
    for mode, ls in (("causal", "-"), ("bidirectional", "--")):
        aps, raps, ns = hand[mode]
        for ax_lines, label, y in ((left, f"head outputs, {mode}", aps), (left, f"residual, {mode}", raps),
                                   (right_lines, f"head outputs, {mode}", ns)):
            line = ax_lines[label]
            assert list(line.get_xdata()) == x and line.get_linestyle() == ls, label
            assert list(line.get_ydata()) == pytest.approx(y, abs=1e-12), label
    # the error bars: one container per mode on the APS panel, each bar mean ± sample std
    for mode in MODES:
        c = bars[f"head outputs, {mode}"]
        assert c.has_yerr
        segs = c.lines[2][0].get_segments()
        assert len(segs) == 3
        for seg, xi, m, sd in zip(segs, x, hand[mode][0], stds[mode]):
            (x0, y0), (x1, y1) = seg
            assert x0 == x1 == xi and sorted([y0, y1]) == pytest.approx([m - sd, m + sd], abs=1e-12)
    assert not axes[1].containers  # the norm score is drawn without error bars
    # on the APS panel the two families are told apart by their markers (the legend shows them)
    for mode in MODES:
        assert left[f"head outputs, {mode}"].get_marker() == "o" and left[f"residual, {mode}"].get_marker() == "x"


def test_aps_figure_error_bars_need_two_sequences():
    def first(n):
        return {k: (v[:, :n] if k in ("aps", "norm_score", "resid_aps", "resid_norm_score") else v)
                for k, v in CAUSAL.items()}
    (c,) = neighborhood_figures({"causal": first(1)})[1][1].axes[0].containers
    assert not c.has_yerr  # one sequence: no spread to show
    assert list(c.lines[0].get_ydata()) == pytest.approx([0.5, 0.2, 0.1])
    (c,) = neighborhood_figures({"causal": first(2)})[1][1].axes[0].containers
    assert c.has_yerr
    half = [abs(y1 - y0) / 2 for (_, y0), (_, y1) in c.lines[2][0].get_segments()]
    assert half == pytest.approx([0.2 / math.sqrt(2), 0.2 / math.sqrt(2), 0.0], abs=1e-12)  # |a - b| / sqrt(2)


def test_cosine_map_figures_show_the_mean_maps_lower_triangle():
    figs = neighborhood_figures({"causal": CAUSAL, "bidirectional": BID}, title="tiny")
    for (name, fig, caption), mode, r in zip(figs[:2], MODES, (CAUSAL, BID)):
        assert mode in fig.get_suptitle() and "tiny" in fig.get_suptitle() and mode in caption
        panels = [ax for ax in fig.axes if ax.get_images()]
        assert [ax.get_title() for ax in panels] == ["embeddings", "layer 0", "layer 1"]
        for k, ax in enumerate(panels):
            a = ax.get_images()[0].get_array()
            T = r["cosine"].shape[-1]
            for i in range(T):
                for j in range(T):
                    if j > i:
                        assert a.mask[i, j]  # the upper triangle is blank
                    else:
                        assert float(a[i, j]) == pytest.approx(float(r["cosine"][k, i, j]), abs=1e-12)


# --------------------------------------------------------------------------------------------
# the CharSource of --chars
# --------------------------------------------------------------------------------------------
class _OrdTokenizer:
    """One token per character (its code point); no ``bos_token_id`` attribute at all."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


class _PairTokenizer(_OrdTokenizer):
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text] * 2}


def test_char_source_without_bos_and_its_errors():
    src = CharSource(_OrdTokenizer(), "ab", seq_len=6, num_seqs=4, seed=3)
    assert src.bos is None and src.pool == [97, 98]
    ids = src.batch(0, 4)
    assert ids.shape == (4, 6) and set(ids.flatten().tolist()) == {97, 98}  # no BOS first
    assert src.describe() == {"kind": "chars", "chars": "ab", "bos": None, "seq_len": 6, "num_seqs": 4, "seed": 3}
    with pytest.raises(PoslensError, match=r"^--chars 'ab': character 'a' is not one token"):
        CharSource(_PairTokenizer(), "ab", 6, 4, 0)


# --------------------------------------------------------------------------------------------
# the command on a tiny random model
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny("llama", tmp_path_factory.mktemp("nbm") / "tiny", layers=2)


class _Progress:
    """Stands in for poslens.progress.task_progress: records the bar's arguments and its updates."""

    def __init__(self):
        self.opened, self.updates = [], []

    def __call__(self, description, total, enabled=True, **kw):
        import contextlib

        self.opened.append((description, total, enabled))

        @contextlib.contextmanager
        def cm():
            yield lambda done, total_=None, info="": self.updates.append((done, info))
        return cm()


def _per_sequence(out: Path) -> tuple[dict, dict]:
    from safetensors import safe_open

    with safe_open(str(out / "neighborhood.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k).to(torch.float64) for k in f.keys()}, f.metadata()


def test_one_run_as_written(model_dir, tmp_path, monkeypatch):
    """One run with the bidirectional control and figures, every check in this one test (mutation
    testing runs only the tests that call the code, and a shared fixture's run counts for one test)."""
    out = tmp_path / "run"
    cfg = NeighborhoodConfig(model_dir=str(model_dir), out=str(out), seq_len=8, num_seqs=3, batch_size=2, seed=5,
                             bidirectional=True, device="cpu")
    prog, drawn = _Progress(), {}
    real_save = nb.save_figures

    def keep_figures(stage, figures):
        figures = list(figures)
        drawn.update({name: fig for name, fig, _ in figures})
        return real_save(stage, figures)
    monkeypatch.setattr(nb, "task_progress", prog)
    monkeypatch.setattr(nb, "save_figures", keep_figures)
    returned = nb.run_neighborhood(cfg, progress=True)

    # the progress bar: 3 sequences x 2 modes, updated after each batch of 2, ending at the total
    assert prog.opened == [("neighbourhood", 6, True)]
    done = [d for d, _ in prog.updates]
    assert done == sorted(done) and done[-1] == 6
    assert [d for d, info in prog.updates if info == "causal"] == [2, 3]
    assert [d for d, info in prog.updates if info == "bidirectional"] == [5, 6]

    # config.json: the command and every option as given, the model and the source
    c = json.loads((out / "config.json").read_text())
    assert c["command"] == "neighborhood"
    for field, value in dataclasses.asdict(cfg).items():
        assert c[field] == value, field
    assert c["versions"] and str(model_dir) in json.dumps(c["model_source"])
    # random tokens over the model's whole vocabulary (config.json's vocab_size), as written in both files
    assert c["source"] == {"kind": "random", "seq_len": 8, "num_seqs": 3, "vocab_size": V, "seed": 5}

    s = json.loads((out / "summary.json").read_text())
    assert s["source"] == c["source"]
    assert s["command"] == "neighborhood" and s["paper"] == "neighborhood" and s["experiment"] == "neighborhood"
    assert s["model_dir"] == str(model_dir) and s["model_type"] == "llama"
    assert s["pe"] == "other"  # poslens' families are told by no_rope_layers, which a stock llama config lacks
    assert s["num_seqs"] == 3 and s["seq_len"] == 8 and s["modes"] == ["causal", "bidirectional"]
    assert isinstance(s["wall_s"], float) and s["wall_s"] > 0 and returned["wall_s"] == s["wall_s"]
    describes = s["layer_info"]["describes"]
    assert "resid_" in describes and "embeddings" in describes
    assert s["layer_info"]["indices"] == ["embeddings", 0, 1] and s["layer_info"]["convention"] == nb.LAYER_CONVENTION
    tensors, meta = _per_sequence(out)
    assert "embeddings" in json.loads(meta["layer_index"]) and json.loads(meta["modes"]) == ["causal", "bidirectional"]
    for k, layer in enumerate(s["layers"]):
        checks = [("aps_mean", "causal.aps", statistics.mean), ("aps_std", "causal.aps", statistics.stdev),
                  ("norm_score_mean", "causal.norm_score", statistics.mean),
                  ("norm_score_std", "causal.norm_score", statistics.stdev),
                  ("resid_aps_mean", "causal.resid_aps", statistics.mean),
                  ("resid_aps_std", "causal.resid_aps", statistics.stdev),
                  ("resid_norm_score_mean", "causal.resid_norm_score", statistics.mean),
                  ("bidirectional_aps_mean", "bidirectional.aps", statistics.mean),
                  ("bidirectional_aps_std", "bidirectional.aps", statistics.stdev),
                  ("bidirectional_norm_score_mean", "bidirectional.norm_score", statistics.mean)]
        for key, tensor, stat in checks:
            per_seq = tensors[tensor][k].tolist()
            assert len(per_seq) == 3
            assert layer[key] == pytest.approx(stat(per_seq), abs=1e-6), (k, key)
        # the table's cells: mean ± std of the same per-sequence scores, to three significant digits
        row = s["tables"][0]["rows"][k]
        assert row[0] == layer["layer"]
        for cell, tensor in zip(row[1:], ("causal.aps", "causal.norm_score", "causal.resid_aps", "bidirectional.aps",
                                          "bidirectional.norm_score")):
            vals = tensors[tensor][k].tolist()
            parts = cell.split(" ± ")
            assert float(parts[0]) == pytest.approx(statistics.mean(vals), rel=6e-3, abs=1e-9), (k, tensor, cell)
            sd = statistics.stdev(vals)
            if len(parts) == 2:
                assert float(parts[1]) == pytest.approx(sd, rel=6e-3, abs=1e-9), (k, tensor, cell)
            else:
                assert sd < 5e-4, (k, tensor, cell)
    assert s["tables"][0]["columns"][4:] == ["APS bidirectional", "norm score bidirectional"]
    names = {"cosine_maps.png", "cosine_maps_bidirectional.png", "aps_by_layer.png"}
    assert {f["file"] for f in s["figures"]} == names == set(drawn)
    assert all((out / f["file"]).stat().st_size > 0 and f["caption"] for f in s["figures"])
    assert all(fig.get_suptitle().startswith("tiny ") for fig in drawn.values())  # titled by the model's name


def test_overwrite_and_a_causal_only_run_without_figures(model_dir, tmp_path, monkeypatch, capfd):
    out = tmp_path / "run"
    out.mkdir()
    (out / "old.txt").write_text("a previous run")
    cfg = NeighborhoodConfig(model_dir=str(model_dir), out=str(out), seq_len=6, num_seqs=2, batch_size=4,
                             figures=False, device="cpu")
    with pytest.raises(PoslensError, match="--overwrite"):
        nb.run_neighborhood(cfg, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["old.txt"]  # nothing written
    prog = _Progress()
    monkeypatch.setattr(nb, "task_progress", prog)
    capfd.readouterr()
    s = nb.run_neighborhood(dataclasses.replace(cfg, overwrite=True), progress=False)
    assert "Loading weights" not in capfd.readouterr().err  # quiet: no weight-loading bars either
    assert prog.opened == [("neighbourhood", 2, False)] and prog.updates[-1] == (2, "causal")
    assert s["modes"] == ["causal"] and s["figures"] == [] and len(s["tables"][0]["columns"]) == 4
    assert not any(k.startswith("bidirectional") for k in s["layers"][0])
    assert not list(out.glob("*.png"))
    tensors, _ = _per_sequence(out)
    assert tensors and all(k.startswith("causal.") for k in tensors)
    assert json.loads((out / "config.json").read_text())["overwrite"] is True


@pytest.mark.parametrize("change, flag", [
    ({"num_seqs": 0}, "--num-seqs 0: must be a positive integer"),
    ({"num_seqs": -1, "chars": "01"}, "--num-seqs -1: must be a positive integer"),  # --chars has no later check
    ({"batch_size": 0}, "--batch-size 0: must be a positive integer"),
    ({"seq_len": 2}, "--seq-len 2: the APS counts position triples"), ({"seq_len": 129}, "--seq-len 129 exceeds")])
def test_bad_options_name_themselves_and_write_nothing(model_dir, tmp_path, change, flag):
    out = tmp_path / "run"
    cfg = dataclasses.replace(NeighborhoodConfig(model_dir=str(model_dir), out=str(out), device="cpu"), **change)
    with pytest.raises(PoslensError) as e:
        nb.run_neighborhood(cfg, progress=False)
    assert e.value.cli().startswith(flag)  # the CLI's face of the error (str() names the keyword)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_three_tokens_are_enough(model_dir, tmp_path):
    _, _, source, _ = nb._plan(NeighborhoodConfig(model_dir=str(model_dir), out=str(tmp_path / "r"), seq_len=3,
                                                  num_seqs=1, device="cpu"))
    assert source.batch(0, 1).shape == (1, 3)


def test_random_data_needs_no_tokenizer_but_text_does(model_dir, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(model_dir, d)
    (d / "tokenizer.json").write_text("{ not a tokenizer")
    config, adapter, source, device = nb._plan(NeighborhoodConfig(model_dir=str(d), out=str(tmp_path / "r"),
                                                                  seq_len=5, num_seqs=2, device="cpu"))
    assert source.describe()["kind"] == "random" and device == "cpu" and adapter.model_type == "llama"
    with pytest.raises(PoslensError, match="could not load the tokenizer"):
        nb._plan(NeighborhoodConfig(model_dir=str(d), out=str(tmp_path / "r"), data="stdlib", device="cpu"))


def test_a_config_without_vocab_size_is_a_clear_error(model_dir, tmp_path, monkeypatch):
    real = nb.open_model_config

    def no_vocab(*a, **kw):
        config, adapter = real(*a, **kw)
        return types.SimpleNamespace(model_type=config.model_type), adapter
    monkeypatch.setattr(nb, "open_model_config", no_vocab)
    with pytest.raises(PoslensError, match="vocab_size"):
        nb._plan(NeighborhoodConfig(model_dir=str(model_dir), out=str(tmp_path / "r"), device="cpu"))


@pytest.fixture(scope="module")
def char_model_dir(model_dir, tmp_path_factory):
    """The tiny model with a character tokenizer (ids below its vocabulary of 100)."""
    from poslens.data.tokenizer import char_tokenizer

    d = tmp_path_factory.mktemp("nbc") / "chars"
    shutil.copytree(model_dir, d)
    tok = char_tokenizer()
    assert len(tok) <= V
    tok.save_pretrained(d)
    return d


def test_text_data_goes_through_the_models_tokenizer(char_model_dir, tmp_path):
    from poslens.data.tokenizer import char_tokenizer

    text = tmp_path / "digits.txt"
    text.write_text("0123456789" * 8)
    _, _, source, _ = nb._plan(NeighborhoodConfig(model_dir=str(char_model_dir), out=str(tmp_path / "r"),
                                                  data=str(text), seq_len=7, num_seqs=3, device="cpu"))
    ids = source.batch(0, 3)
    digit_ids = {char_tokenizer()(c, add_special_tokens=False)["input_ids"][0] for c in "0123456789"}
    assert ids.shape == (3, 7)
    body = ids.flatten().tolist()
    assert set(body) - digit_ids <= {char_tokenizer().bos_token_id, char_tokenizer().eos_token_id}
    assert len(set(body) & digit_ids) == 10


def test_chars_source_and_its_tokenizer_options(char_model_dir, tmp_path, monkeypatch):
    calls = []
    real = nb.load_tokenizer

    def recording(model_dir, trust_remote_code=False):
        calls.append((str(model_dir), trust_remote_code))
        return real(model_dir, trust_remote_code)
    monkeypatch.setattr(nb, "load_tokenizer", recording)
    base = NeighborhoodConfig(model_dir=str(char_model_dir), out=str(tmp_path / "r"), seq_len=6, num_seqs=2,
                              device="cpu", chars="0123")
    *_, source, _ = nb._plan(dataclasses.replace(base, trust_remote_code=True))
    assert calls == [(str(char_model_dir), True)]  # --trust-remote-code reaches the tokenizer too
    d = source.describe()
    assert d["kind"] == "chars" and d["chars"] == "0123" and d["bos"] == 1
    assert (source.batch(0, 2)[:, 0] == 1).all()
    calls.clear()
    nb._plan(dataclasses.replace(base, chars=None))  # random tokens: the tokenizer is not even opened
    assert calls == []
    with pytest.raises(PoslensError, match="^--chars and --data"):
        nb._plan(dataclasses.replace(base, data="stdlib"))


def test_chars_without_a_tokenizer(model_dir, tmp_path):
    with pytest.raises(PoslensError, match="^--chars needs the model's tokenizer"):
        nb._plan(NeighborhoodConfig(model_dir=str(model_dir), out=str(tmp_path / "r"), chars="01", device="cpu"))


def test_pickle_weights_load_with_allow_pickle(model_dir, tmp_path):
    """--allow-pickle reaches the weight loading too (a directory with only pytorch_model.bin)."""
    from safetensors.torch import load_file

    d = tmp_path / "pickled"
    d.mkdir()
    shutil.copy(model_dir / "config.json", d / "config.json")
    torch.save(load_file(str(model_dir / "model.safetensors")), d / "pytorch_model.bin")
    cfg = NeighborhoodConfig(model_dir=str(d), out=str(tmp_path / "r"), seq_len=5, num_seqs=2, figures=False,
                             device="cpu")
    with pytest.raises(PoslensError, match="allow_pickle=True"):
        nb.run_neighborhood(cfg, progress=False)
    s = nb.run_neighborhood(dataclasses.replace(cfg, allow_pickle=True), progress=False)
    ref = nb.run_neighborhood(dataclasses.replace(cfg, model_dir=str(model_dir), out=str(tmp_path / "r2")),
                              progress=False)
    assert s["layers"] == ref["layers"]  # the same weights, the same numbers


def test_model_options_reach_the_loaders(model_dir, tmp_path, monkeypatch):
    """--trust-remote-code reaches the config, the tokenizer and the weights (recorded on the way)."""
    seen = []
    for name in ("open_model_config", "load_model"):
        real = getattr(nb, name)

        def recording(*a, _real=real, _name=name, **kw):
            seen.append((_name, kw.get("trust_remote_code"), kw.get("allow_pickle"), kw.get("dtype")))
            return _real(*a, **kw)
        monkeypatch.setattr(nb, name, recording)
    cfg = NeighborhoodConfig(model_dir=str(model_dir), out=str(tmp_path / "r"), seq_len=5, num_seqs=2, figures=False,
                             device="cpu", trust_remote_code=True)
    nb.run_neighborhood(cfg, progress=False)
    assert seen == [("open_model_config", True, False, None), ("load_model", True, False, torch.float32)]


def test_half_precision_weights_are_measured_in_float32(model_dir, tmp_path):
    """A checkpoint saved in bfloat16 runs in float32: the same numbers as its float32 copy."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    m.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    AutoModelForCausalLM.from_pretrained(str(tmp_path / "bf16"), dtype=torch.float32).save_pretrained(tmp_path / "f32")
    maps = []
    for name in ("bf16", "f32"):
        out = tmp_path / f"run_{name}"
        nb.run_neighborhood(NeighborhoodConfig(model_dir=str(tmp_path / name), out=str(out), seq_len=6, num_seqs=2,
                                               figures=False, device="cpu"), progress=False)
        maps.append(_per_sequence(out)[0]["causal.resid_cosine"])
    torch.testing.assert_close(maps[0], maps[1], rtol=0, atol=1e-6)
