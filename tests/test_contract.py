"""The run-directory contract (one summary shape, one reader), the one number format, 80-column
terminal tables and the report's run discovery."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from rich.console import Console

from poslens.errors import PoslensError
from poslens.fmt import fmt, rich_table
from poslens.rundir.summary import CONTRACT, envelope, write_summary
from poslens.rundir.load import load_run
from poslens.rundir.io import write_json, write_tensors


def test_fmt_one_format():
    assert fmt(21651.977) == "21,652"
    assert fmt(0.000897) == "8.97e-4"
    assert fmt(9.0e-4) == "9.00e-4"
    assert fmt(0.98431) == "0.984" and fmt(0.5) == "0.5" and fmt(-0.0123) == "-0.0123"
    assert fmt(12) == "12" and fmt(150000) == "150,000" and fmt(0.0) == "0"
    assert fmt(None) == fmt(float("nan")) == fmt(float("inf")) == "–"
    assert fmt(True) == "yes"
    # signed: the sign is the point (a trend), "+" only on positive numbers
    assert fmt(0.96, signed=True) == "+0.96" and fmt(-0.831, signed=True) == "-0.831"
    assert fmt(0.0, signed=True) == "0" and fmt(None, signed=True) == "–" and fmt(1234.5, signed=True) == "+1,234"


def test_envelope_and_reader(tmp_path):
    s = write_summary(tmp_path, {"layers": [{"layer": 0, "x": float("nan")}, {"layer": 1, "x": 0.5}],
                                 "figures": ["scores_raw.png", {"file": "a.png", "caption": "mine"},
                                             {"file": "probs.png", "caption": "p", "role": "main"}, "probs.png",
                                             "scores_zoom.png", {"file": "x.png", "role": "bogus"}],
                                 "tables": [{"title": "t", "columns": ["a"], "rows": [[1]]}, "junk"]},
                      command="scan", paper=["kim", "slash"], layers_describe=(describes := "decoder layers"))
    raw = json.loads((tmp_path / "summary.json").read_text())
    assert raw["contract"] == CONTRACT and raw["command"] == "scan" and raw["paper"] == ["kim", "slash"]
    assert raw["layers"][0]["x"] is None  # NaN (masked) entries are JSON null
    assert raw["layer_info"]["indices"] == [0, 1] and "from 0" in raw["layer_info"]["convention"]
    assert raw["layer_info"]["describes"] == describes
    assert raw["figures"][0]["file"] == "scores_raw.png" and "pre-softmax" in raw["figures"][0]["caption"]
    assert raw["figures"][1] == {"file": "a.png", "caption": "mine", "role": "main"}
    # figure roles: a summary's own wins; else the standard one of the file name; unknown roles are ignored
    assert [f["role"] for f in raw["figures"][2:]] == ["main", "detail", "zoom", "main"]
    assert raw["tables"] == [{"title": "t", "columns": ["a"], "rows": [[1]]}]
    assert s["readings"] == []
    write_json(tmp_path / "config.json", {"command": "scan"})
    with pytest.raises(PoslensError, match="maps.safetensors"):  # a scan's tensors are part of the run
        load_run(tmp_path)
    write_tensors(tmp_path / "maps.safetensors", {"scores": torch.zeros(2, 3, 3)})
    run = load_run(tmp_path)
    assert run.command == "scan" and run.papers == ["kim", "slash"] and run.paper == "kim"
    assert [l["layer"] for l in run.layers] == [0, 1] and len(run.tables) == 1 and len(run.figures) == 6
    # an older run without the envelope reads the same way (command from config, figures from files)
    old = tmp_path / "old"
    write_json(old / "config.json", {"command": "simulate"})
    write_json(old / "summary.json", {"paper": "kim", "files": ["summary.json", "probs.png"], "tables": "bad"})
    r = load_run(old)
    assert r.command == "simulate" and r.layers == [] and r.tables == [] and r.figures[0]["file"] == "probs.png"
    # keys a command already set are kept
    assert envelope({"paper": "slash"}, command="slash", paper="kim")["paper"] == "slash"


def test_every_command_writes_the_contract(tmp_path):
    """simulate, scan and train write the common shape (analysis commands go through the same helper)."""
    import torch

    from poslens.capture.scan.options import ScanConfig
    from poslens.capture.scan.run import run_scan
    from poslens.simulator import SimConfig, run_simulation, save_result
    from poslens.models.train import TrainConfig, train_model

    save_result(run_simulation(SimConfig(samples=50, seq_len=6, dim=8, layers=2)), tmp_path / "sim")
    model = tmp_path / "model"
    train_model(TrainConfig(out=str(model), pe="none", task="copy", steps=2, batch_size=4, eval_examples=8,
                            progress=False, threads=1))
    torch.manual_seed(0)
    run_scan(ScanConfig(model_dir=str(model), out=str(tmp_path / "scan"), data="random", seq_len=80, num_seqs=2,
                        batch_size=2), progress=False)
    for name, command in (("sim", "simulate"), ("model", "train"), ("scan", "scan")):
        run = load_run(tmp_path / name)
        s = run.summary
        assert s["contract"] == CONTRACT and s["command"] == command == run.command, name
        for key in ("paper", "layers", "layer_info", "tables", "figures", "readings"):
            assert key in s, (name, key)
        assert s["layer_info"]["indices"] == [l["layer"] for l in run.layers]
        assert all(isinstance(f, dict) and f["caption"] for f in s["figures"])
        assert all((run.path / f["file"]).is_file() for f in s["figures"])
    scan = load_run(tmp_path / "scan")
    assert scan.papers == ["kim", "slash", "neighborhood"]
    assert "scores_zoom.png" in [f["file"] for f in scan.figures]  # 80 positions > the 64-position zoom
    # the analysis commands write the same shape: their judgement's numbers and codes, no sentences; the readings
    # are rendered from the judgement (reporting/readings/), the report's and the terminal's alike
    from poslens.analysis.neighborhood import NeighborhoodConfig, run_neighborhood
    from poslens.analysis.panels import PanelsConfig, run_panels, run_score_maps
    from poslens.metrics.judge.commands import COMMAND_JUDGES
    from poslens.reporting.readings.commands import command_readings
    from poslens.reporting.readings.findings import run_readings

    run_score_maps(str(tmp_path / "scan"), str(tmp_path / "kim-maps"))
    run_neighborhood(NeighborhoodConfig(model_dir=str(model), out=str(tmp_path / "neighborhood"), seq_len=8,
                                        num_seqs=2, figures=False), progress=False)
    run_panels(PanelsConfig(model_dir=str(model), out=str(tmp_path / "panels"), layer=0, data="random", num_seqs=2,
                            seq_len=8, batch_size=2), progress=False)
    for name in ("kim-maps", "neighborhood", "panels"):
        run = load_run(tmp_path / name)
        s = run.summary
        assert s["contract"] == CONTRACT and run.command == name and s["paper"] == "kim" * (name != "neighborhood") \
            + "neighborhood" * (name == "neighborhood"), name
        assert s["layer_info"]["describes"] and "from 0" in s["layer_info"]["convention"], name
        assert s["layer_info"]["indices"] == [l["layer"] for l in run.layers], name
        assert all(isinstance(i, int) or i == "embeddings" for i in s["layer_info"]["indices"]), name
        judged = {k: v for k, v in s.items() if k != "judgement"}
        assert s["readings"] == [] and s["judgement"] and s["judgement"] == COMMAND_JUDGES[name](judged), name
        assert json.dumps(s["judgement"], allow_nan=False)  # plain JSON numbers and codes
        assert command_readings(name, s) and command_readings(name, s) == command_readings(name, judged), name
        assert run_readings(name, [s["paper"]], s, s["paper"]) == command_readings(name, s), name
        assert all((run.path / f["file"]).is_file() and f["caption"] for f in s["figures"]), name
    assert load_run(tmp_path / "neighborhood").layers[0]["layer"] == "embeddings"


def test_terminal_tables_fit_80_columns():
    long = "a rather long explanatory cell that would be cut to an ellipsis in a narrow terminal"
    rows = [[l, 0.98431, 21651.977, 0.000897, long, "h3 Δ=2: 0.25"] for l in range(30)]
    console = Console(width=80, record=True, color_system=None)
    console.print(rich_table("per layer (decoder layers from 0)", ["layer", "relativity index", "tokens / s",
                                                                    "stderr", "note", "top slash head (Δ ≤ 16)"],
                             rows))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text and "0.984" in text and "21,652" in text and "8.97e-4" in text
    assert "h3 Δ=2: 0.25" in text.replace("\n", " ") or "0.25" in text


def test_scan_terminal_table_uses_delta_limited_heads():
    from poslens.cli.scan import scan_table

    layers = [{"layer": l, "relativity_index": 0.9, "locality": 0.1, "aps": 0.93,
               "top_slash_heads": [{"layer": l, "head": 8, "offset": 511, "score": 0.984},
                                   {"layer": l, "head": 2, "offset": 1, "score": 0.31}]} for l in range(30)]
    console = Console(width=80, record=True, color_system=None)
    table = scan_table({"model_type": "llama", "num_seqs": 64, "seq_len": 512, "layers": layers})
    console.print(table)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text
    assert "511" not in text and "Δ=1: 0.31" in text
    aps_header = str(table.columns[-2].header).split()  # no per-sequence APS: the column is the mean-map one
    assert aps_header[-1] == "APS" and aps_header[0] == "mean-map"
    # with the per-sequence APS, the trend and the sink weight (newer scans) it still fits
    for l in layers:
        l.update(aps_mean=0.645, aps_std=0.0213, diagonal_trend=-0.74, sink_weight=0.91)
    console = Console(width=80, record=True, color_system=None)
    console.print(scan_table({"model_type": "llama", "num_seqs": 64, "seq_len": 512, "layers": layers,
                              "layer_convention": "decoder layers from 0; 'embeddings' = the input of layer 0"}))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text
    assert "0.645 ± 0.0213" in text and "-0.74" in text and "0.91" in text and "mean-map" not in text
    assert "corrected" not in text
    # a scan whose noise grid was the whole map: the column says its index is noise-corrected, still 80 columns
    for l in layers:
        l["relativity_index_noise_corrected"] = True
    console = Console(width=80, record=True, color_system=None)
    console.print(scan_table({"model_type": "llama", "num_seqs": 64, "seq_len": 512, "layers": layers}))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text and "corrected" in text
    assert "0.645 ± 0.0213" in text and "h2 Δ=1: 0.31" in text  # no cell wrapped onto a second line
    layers[3]["relativity_index_noise_corrected"] = False  # one plain index: the label cannot claim all are
    console = Console(width=80, record=True, color_system=None)
    console.print(scan_table({"model_type": "llama", "num_seqs": 64, "seq_len": 512, "layers": layers}))
    assert "corrected" not in console.export_text()


def test_readings_do_not_call_the_sink_a_slash_head_nor_contradict_norms():
    from poslens.metrics.judge.papers import judge_neighborhood, judge_slash
    from poslens.reporting.readings.common import layer_aps
    from poslens.reporting.readings.neighborhood import neighborhood_readings
    from poslens.reporting.readings.slash import slash_readings, slash_top

    s = {"seq_len": 512, "slash_top_heads_offset_ge1": [{"layer": 18, "head": 8, "offset": 511, "score": 0.984},
                                                        {"layer": 3, "head": 1, "offset": 2, "score": 0.2}]}
    head = judge_slash(s, slash_top(s))["head"]
    assert (head["layer"], head["head"], head["offset"], head["score"]) == (3, 1, 2, 0.2)
    assert "511" not in " ".join(slash_readings(s))

    def judged(layers):
        return judge_neighborhood({"layers": layers}, layers, [layer_aps(l)[0] for l in layers])

    layers = [{"layer": i, "aps": 0.6, "norm_score": 0.55} for i in range(3)]
    j = judged(layers)
    assert (j["norm"], j["median"], j["per_seq"], j["control"]) == ("steady", 0.55, False, None)
    assert "0.5 = chance" not in " ".join(neighborhood_readings({"layers": layers}))  # a mean map has no chance level
    per_seq = [{"layer": i, "aps_mean": 0.7, "aps_std": 0.05, "aps": 0.95} for i in range(3)]
    j = judged(per_seq)
    assert j["per_seq"] and j["aps"] == [0.7, 0.7, 0.7] and j["max"] == 0.7
    assert "0.95" not in " ".join(neighborhood_readings({"layers": per_seq}))


def test_empty_and_all_zero_tables_are_dropped():
    from poslens.reporting.elements import sparse_sentence, table

    assert table("persistence", ["head", "Δ"], []) is None
    assert sparse_sentence("persistence", ["head", "Δ"], []) == "persistence: no rows"
    zeros = [[k, 0, 0, 0, 0, 0] for k in (0.1, 0.3, 0.5, 0.9)]
    assert table("counts", ["κ", "Δ=1", "Δ=2", "Δ=3", "Δ=4", "Δ=5"], zeros) is None
    zeros[1][2] = 2
    assert table("counts", ["κ", "Δ=1", "Δ=2", "Δ=3", "Δ=4", "Δ=5"], zeros) is None
    assert sparse_sentence("counts", ["κ", "Δ=1", "Δ=2", "Δ=3", "Δ=4", "Δ=5"], zeros) == \
        "counts: all 20 entries 0 except κ 0.3, Δ=2: 2"
    t = table("counts", ["κ", "1", "2"], [[0.5, 0, 3], [0.9, 0, 0]])  # small tables stay tables
    assert t is not None and t["rows"][0][2]["v"] == "3"
    assert table("text", ["a", "b"], [["x", "y"]]) is not None


def test_layer_plots_have_integer_ticks():
    import matplotlib.pyplot as plt

    from poslens.reporting.plots import layer_lines

    fig = layer_lines([{"title": "x", "series": [{"label": "a", "layers": [0, 1, 2], "values": [0.1, None, 0.3],
                                                  "errors": [0.01, None, 0.02]}]}])
    fig.canvas.draw()
    ticks = fig.axes[0].get_xticks()
    assert len(ticks) and all(float(t).is_integer() for t in ticks)
    plt.close(fig)


def _mini_run(d, i):
    write_json(d / f"run{i}" / "config.json", {"command": "future-thing"})
    write_json(d / f"run{i}" / "summary.json", {"paper": "kim", "readings": [f"reading {i}"]})


def test_report_refuses_an_ambiguous_search(cli, tmp_path):
    from poslens.reporting import collect

    tmp = tmp_path / "tmp"
    for i in range(7):
        _mini_run(tmp / f"deep{i % 2}", i)
    with pytest.raises(PoslensError, match=r"holds 7 runs .* --all"):
        collect([tmp])
    runs, _ = collect([tmp], allow_many=True)
    assert len(runs) == 7
    write_json(tmp / "demo.json", {"finished": True})  # a folder poslens wrote to hold runs is not ambiguous
    assert len(collect([tmp])[0]) == 7
    (tmp / "demo.json").unlink()
    out = tmp_path / "r.html"
    code, _, err = cli("report", tmp, "--out", out)
    assert code == 2 and "--all" in err and not out.exists()
    code, stdout, _ = cli("report", tmp, "--all", "--out", out)
    assert code == 0 and out.is_file()
    listed = [line.split()[0] for line in stdout.splitlines() if line.startswith("  ")]
    assert sorted(listed) == sorted(str(tmp / f"deep{i % 2}" / f"run{i}") for i in range(7))  # every run, once


def test_scan_terminal_table_reads_delta_limited_heads_from_the_maps():
    import numpy as np

    from poslens.cli.scan import scan_table

    layers = [{"layer": l, "relativity_index": 0.9, "locality": 0.1, "aps": 0.6, "top_slash_heads": [
        {"layer": l, "head": 0, "offset": 255, "score": 0.9}]} for l in range(2)]
    best = np.array([[0.1, 0.4, np.nan], [np.nan, np.nan, np.nan]])
    arg = np.array([[1, 3, 1], [1, 1, 1]])
    console = Console(width=80, record=True, color_system=None)
    console.print(scan_table({"model_type": "llama", "num_seqs": 4, "seq_len": 256, "layers": layers}, (best, arg)))
    text = console.export_text()
    assert "h1 Δ=3: 0.4" in text and "255" not in text


def test_newer_scan_keys_render(tmp_path):
    """Keys the sink-aware scans write (per-sequence APS with std, trend with its standard error,
    within-diagonal RMS beside its noise floor, p-values) render as plots, not long tables; a scan
    written without the envelope still lands in all three papers' sections."""
    from poslens.metrics.judge.papers import kim_finding
    from poslens.reporting import render_report
    from poslens.reporting.quantities import layer_quantities

    layers = [{"layer": l, "relativity_index": 0.9 - 0.01 * l, "relativity_index_with_sink": 0.5, "locality": 0.2,
               "diagonal_trend": -0.5, "diagonal_trend_se": 0.1, "within_diag_rms": 0.02,
               "within_diag_rms_noise": 0.01, "nonrelative_p": 0.001, "noise_groups": 16, "sink_weight": 0.8,
               "aps": 0.64, "aps_mean": 0.64, "aps_std": 0.03, "mean_map_aps": 0.93, "norm_score": 0.8}
              for l in range(8)]
    d = tmp_path / "scan"
    write_json(d / "config.json", {"command": "scan"})
    write_json(d / "summary.json", {"model_type": "llama", "num_seqs": 16, "seq_len": 64, "layers": layers,
                                    "embedding_aps_mean": 0.5})
    run = load_run(d)
    assert run.papers == ["kim", "slash", "neighborhood"]
    q = layer_quantities(run)
    assert q["kim"][:3] == ["relativity_index", "locality", "diagonal_trend"]
    assert "within_diag_rms_noise" not in q["kim"] and "noise_groups" not in q["kim"]
    assert "aps" not in q["neighborhood"] and q["neighborhood"][0] == "aps_mean"
    # the mean-map APS stays in summary.json beside the per-sequence one; with-sink values, noise floors
    # and grid statistics are companions drawn dashed in their key's panel, not panels of their own
    assert "mean_map_aps" not in q["neighborhood"] and "relativity_index_with_sink" not in q["kim"]
    # a scan whose noise grid is the whole map: the plain index is a companion of the corrected one
    for l in layers:
        l.update(relativity_index_uncorrected=0.7, relativity_index_noise_corrected=True)
    write_json(d / "summary.json", {"model_type": "llama", "num_seqs": 16, "seq_len": 64, "layers": layers,
                                    "embedding_aps_mean": 0.5})
    q = layer_quantities(load_run(d))
    assert q["kim"][0] == "relativity_index" and not [k for k in q["kim"] if "corrected" in k]
    html = render_report([d])
    heads = [re.findall(r'<th scope="col">(.*?)</th>', t) for t in re.findall(r"<table>(.*?)</table>", html, re.S)]
    assert not [h for h in heads if h[:1] == ["layer"]]  # 8 layers: plots, no per-layer table
    assert kim_finding(layers)["sink"] is True  # the relativity index is read with key 0 excluded
    assert "APS of the residual stream per sequence 0.64" in html


def test_command_readings_are_rendered_from_the_judgement():
    """Every analysis command's summary holds its judgement (numbers and codes, metrics/judge/commands.py), which
    reads its numbers; its sentences come from reporting/readings/ and are rendered from the judgement alone."""
    import ast
    import importlib
    import inspect

    from poslens.metrics.judge import commands as J
    from poslens.reporting.readings import commands as R
    from poslens.reporting.readings.findings import run_readings

    assert set(J.COMMAND_JUDGES) == {"neighborhood", "panels", "kim-maps", "slash", "slash-dynamics", "sweep", "probes"}
    # ablate, compare and the fingerprint render their own records (reporting/readings/ablate.py, compare.py,
    # fingerprint.py)
    assert set(R.COMMAND_READINGS) == set(J.COMMAND_JUDGES) | {"ablate", "compare", "fingerprint"}
    for mod in ("neighborhood", "panels", "slash", "sweep", "dynamics", "probes"):  # no prose left in analysis/*
        m = importlib.import_module(f"poslens.analysis.{mod}")
        own = [n for n in vars(m) if "reading" in n and getattr(vars(m)[n], "__module__", "") == m.__name__]
        assert not own, (mod, own)
        tree = ast.parse(inspect.getsource(m))
        imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + \
            [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [i for i in imported if i and i.startswith("poslens.reporting")], mod

    def rendered(command, s):  # the sentences of the judgement alone are those of the summary
        j = J.COMMAND_JUDGES[command](s)
        assert R.command_readings(command, {"judgement": j}) == R.command_readings(command, s)
        return j

    nb = {"layers": [{"layer": "embeddings", "aps_mean": 0.5},
                     {"layer": 0, "aps_mean": 0.97, "norm_score_mean": 0.9, "bidirectional_aps_mean": 0.51},
                     {"layer": 1, "aps_mean": 0.7}], "theory_gap_layer0": 0.01}
    j = rendered("neighborhood", nb)
    assert (j["layer"], j["aps"], j["adjacency"], j["embeddings_aps"]) == (0, 0.97, "clear", 0.5)
    assert (j["best_layer"], j["best_aps"], j["last_layer"], j["last_aps"]) == (0, 0.97, 1, 0.7)
    assert (j["bidirectional_aps"], j["mask_drop"], j["mask"]) == (0.51, pytest.approx(0.46), "creates")
    assert (j["norm"], j["theory"]) == ("shrink", "close")
    nb["layers"][1].update(aps_mean=0.65, bidirectional_aps_mean=0.64, norm_score_mean=0.2)
    nb["theory_gap_layer0"] = 0.2
    j = rendered("neighborhood", nb)
    assert (j["adjacency"], j["mask"], j["norm"], j["theory"]) == ("weak", "little", "grow", "far")

    sw = {"results": [{"shape": "2x64", "sigma": 0.002, "aps_causal_mean": [0.5, 0.95, 0.9],
                       "aps_bidirectional_mean": [0.5, 0.52, 0.49]},
                      {"shape": "2x64", "sigma": 2.0, "aps_causal_mean": [0.5, 0.55, 0.5],
                       "aps_bidirectional_mean": [0.5, 0.5, 0.47]}]}
    j = rendered("sweep", sw)
    (shape,) = j["shapes"]
    assert (shape["lowest"], shape["highest"]) == ({"sigma": 2.0, "aps": 0.55}, {"sigma": 0.002, "aps": 0.95})
    assert shape["clear_sigmas"] == [0.002] and shape["adjacency"] == "clear"
    assert shape["last_layer"] == {"layer": 1, "sigmas": [0.002, 2.0], "aps": [0.9, 0.5]}
    assert j["bidirectional_dev"] == pytest.approx(0.03) and j["mask"] == "creates"

    heads = [{"layer": l, "head": h, "best_delta": 1, "best_score": 0.1 * (l + h + 1), "q_top1_energy": 0.5}
             for l in range(2) for h in range(2)]
    sl = {"heads": heads, "kappas": [0.1, 0.3, 0.5], "delta_range": [1, 16], "seq_len": 8, "persistence": []}
    j = rendered("slash", sl)
    assert j["best"] == {"layer": 1, "head": 1, "delta": 1, "score": 0.1 * 3,
                         "uniform": pytest.approx(sum(1 / i for i in range(2, 9)) / 7)}
    assert j["kappas"]["reached"] == [{"kappa": 0.1, "heads": 4}, {"kappa": 0.3, "heads": 1}] and j["heads"] == 4
    assert j["persistence"]["tested"] == 0 and j["rope"] is False and "decomposition" not in j

    pr = {"verdicts": [{"model": "m", "pe": "none", "state": "trained", "cosine_best_r": 0.93, "cosine_best_layer": 0,
                        "norm_best_r": 0.4, "norm_best_layer": 1, "cosine_lower_mse_layers": 2, "layers": 2,
                        "cosine_beats_norm": "yes"}],
          "records": [{"model": "m", "state": "trained", "feature": "vector", "probe": "linear", "layer": l, "r": r}
                      for l, r in (("embeddings", 0.99), (0, 0.8), (1, 0.6))]}
    (v,) = rendered("probes", pr)["verdicts"]
    assert (v["cosine_best_r"], v["cosine_best_layer"], v["cosine_lower_mse_layers"], v["layers"]) == (0.93, 0, 2, 2)
    assert v["cosine_beats_norm"] == "yes" and v["vector"] == {"r": 0.8, "layer": 0}  # embeddings: no decoder layer

    pn = {"layer": 3, "panels": [{"panel": "a", "locality": 0.5, "non_relativity": 0.1,
                                  "non_relativity_with_sink": 0.4},
                                 {"panel": "b", "locality": -0.2},
                                 {"panel": "i", "locality": 0.05, "non_relativity": 0.3,
                                  "non_relativity_with_sink": 0.6}]}
    j = rendered("panels", pn)
    assert (j["layer"], j["rising"], j["panels"]) == (3, 2, 3)
    assert (j["strongest"], j["weakest"]) == ({"panel": "a", "locality": 0.5}, {"panel": "b", "locality": -0.2})
    assert j["non_relativity"] == {"a": 0.1, "i": 0.3} and j["with_sink"] == {"a": 0.4, "i": 0.6}
    assert j["trend"] == "distant"

    # a scan (three papers) is read per paper from its numbers; 'flat' names the noise it was judged against
    scan = {"layers": [{"layer": 0, "relativity_index": None, "locality": None, "noise_groups": 16},
                       {"layer": 1, "relativity_index": 0.9, "locality": 0.5, "noise_groups": 16}]}
    text = " ".join(run_readings("scan", ["kim", "slash", "neighborhood"], scan, "kim"))
    assert text.startswith("Layer 0 is flat within sampling noise (the noise floor of 16 independent groups")


def test_scan_uncertainties_sit_beside_the_statistic_they_describe():
    """A scan keeps sample groups on a coarser grid than its map: the grid map's own statistics are given
    beside the full-map headline numbers, and the report and readings say which is which."""
    import torch

    from poslens.capture.scan.finalize import score_map_numbers
    from poslens.metrics.diagonal import causal_view
    from poslens.metrics import diagonal_trend, relativity_index
    from poslens.metrics.judge.papers import judge_kim

    S, G = 40, 8
    i = torch.arange(S, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    # a non-relative map: rises with the key position, plus a curved query term; the groups are noisy copies
    m = -(i[:, None] - i[None, :]).abs() + 0.05 * i[None, :] + 0.002 * (i[:, None] - 20) ** 2
    groups_full = m + 0.01 * torch.randn(G, S, S, generator=gen, dtype=torch.float64)
    sc = groups_full.mean(0)
    grid = torch.arange(0, S, 2)
    g = groups_full[:, grid][:, :, grid]
    out = score_map_numbers(sc, causal_view(g, include_diagonal=True), torch.ones(G), grid, 16)
    cv_grid = causal_view(sc[grid][:, grid])
    assert out["noise_positions"] == 20
    assert out["grid_diagonal_trend"] == pytest.approx(diagonal_trend(cv_grid, exclude_keys=(0,)), abs=1e-12)
    # on the grid the index is noise-corrected with the groups (the full map has no groups to correct with)
    gcv = causal_view(g, include_diagonal=True)
    assert out["grid_relativity_index"] == pytest.approx(relativity_index(cv_grid, gcv, torch.ones(G),
                                                                          exclude_keys=(0,)), abs=1e-12)
    assert out["diagonal_trend"] == pytest.approx(diagonal_trend(causal_view(sc), exclude_keys=(0,)), abs=1e-12)
    assert out["trend_p"] is not None and out["diagonal_trend_se"] is not None
    # a grid covering every position: one set of statistics, no grid_* copies
    full = score_map_numbers(sc, causal_view(groups_full, include_diagonal=True), torch.ones(G), torch.arange(S), 16)
    assert not [k for k in full if k.startswith("grid_")]
    # ... and there the headline index is the noise-corrected one (group cross-products), the plain one beside it
    gfull = causal_view(groups_full, include_diagonal=True)
    assert full["relativity_index_noise_corrected"] is True
    assert full["relativity_index"] == pytest.approx(relativity_index(causal_view(sc), gfull, torch.ones(G),
                                                                      exclude_keys=(0,)), abs=1e-12)
    assert full["relativity_index_uncorrected"] == pytest.approx(relativity_index(causal_view(sc), exclude_keys=(0,)),
                                                                 abs=1e-12)
    # with more noise the plain index is biased low (noise adds within-diagonal variance), the corrected one is
    # not: the noiseless map's index is 0.99651; 8 groups of sd 3 give the plain index 0.9839 ± 0.0011 and the
    # corrected one 0.9961 ± 0.0011 (mean ± sd over 20 seeds)
    truth = relativity_index(causal_view(m), exclude_keys=(0,))
    noisy = m + 3.0 * torch.randn(G, S, S, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    nfull = score_map_numbers(noisy.mean(0), causal_view(noisy, include_diagonal=True), torch.ones(G),
                              torch.arange(S), 16)
    assert nfull["relativity_index"] == pytest.approx(truth, abs=0.004)
    assert truth - nfull["relativity_index_uncorrected"] > 0.008
    assert "relativity_index_noise_corrected" not in out

    noise = judge_kim([{"layer": 0, **out}])["noise"]["grid"]
    assert (noise["positions"], noise["trend"], noise["relativity"]) == \
        (20, [out["grid_diagonal_trend"]], [out["grid_relativity_index"]])


def test_figure_roles_keep_the_page_short(tmp_path):
    """Details stay in the run directory (named), a figure of the per-layer numbers gives way to the
    report's own line plots, a zoom is shown only on maps much larger than its 64 positions."""
    from poslens.reporting.cards import run_figures
    from poslens.rundir.load import Run

    figs = ["scores_raw.png", "probs.png", "aps_by_layer.png", "scores_zoom.png"]
    for f in figs:
        (tmp_path / f).write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)

    def shown(seq_len, drawn):
        notes: list[str] = []
        run = Run(tmp_path, "command", "scan", summary={"seq_len": seq_len, "figures": figs})
        return [f["file"] for f in run_figures(run, notes, per_layer_drawn=drawn)], notes

    files, notes = shown(512, True)
    assert files == ["scores_raw.png", "scores_zoom.png"]
    assert len(notes) == 1 and re.findall(r"[\w.]+\.png", notes[0]) == ["probs.png", "aps_by_layer.png"]
    assert shown(128, False)[0] == ["scores_raw.png", "aps_by_layer.png"]  # no line plots of it: the figure stays


def test_kim_readings_say_from_layer_k_on_only_when_it_is_so():
    from poslens.metrics.judge.papers import judge_kim

    live = {"relativity_index": 0.9, "locality": 0.2}
    flat = {"relativity_index": None, "locality": None}
    tail = judge_kim([{"layer": 0, **flat}, {"layer": 1, **live}, {"layer": 2, **live}])
    assert tail["series"]["tail"] and tail["live"] == [1, 2]
    mixed = judge_kim([{"layer": 0, **flat}, {"layer": 1, **live}, {"layer": 2, **flat}, {"layer": 3, **live}])
    assert not mixed["series"]["tail"] and mixed["live"] == [1, 3]
    many = [{"layer": l, **flat} for l in range(30)]
    many[16], many[23] = {"layer": 16, **live}, {"layer": 23, **live}
    j = judge_kim(many)
    assert (j["count"], j["live"], len(j["flat"])) == (30, [16, 23], 28)
