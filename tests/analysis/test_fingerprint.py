"""``poslens fingerprint`` on tiny random models: files, structure, layer types, tables that fit 80
columns, errors. The traits' numbers are checked against independent computations in
tests/metrics/test_fingerprint_metrics.py (planted structure) and tests/analysis/test_fingerprint_real.py
(SmolLM2 against eager attention)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.archs import V, save_tiny

S, N = 16, 4


@pytest.fixture(scope="module")
def ids_file(tmp_path_factory):
    g = torch.Generator().manual_seed(0)
    p = tmp_path_factory.mktemp("data") / "ids.jsonl"
    with open(p, "w") as f:
        for _ in range(N):
            f.write(json.dumps({"input_ids": torch.randint(3, V, (S,), generator=g).tolist()}) + "\n")
    return p


@pytest.fixture(scope="module")
def two_models(tmp_path_factory, ids_file):
    """A Gemma 3 model (sliding and global layers, two RoPE bases) and a Phi-3 model (partial rotary),
    fingerprinted once through the CLI."""
    from poslens.cli import main

    root = tmp_path_factory.mktemp("fp")
    gemma = save_tiny("gemma3_text", root / "gemma3")
    phi = save_tiny("phi3", root / "phi3")
    out = root / "out"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            main(["fingerprint", str(gemma), str(phi), "--out", str(out), "--data", str(ids_file), "--seq-len", str(S),
                  "--num-seqs", str(N), "--batch-size", "2", "--threads", "1"])
        except SystemExit as e:
            assert not e.code, e.code
    torch.set_num_threads(1)
    return out, buf.getvalue()


def test_files_and_models(two_models):
    out, _ = two_models
    for f in ("fingerprint.json", "fingerprint.safetensors", "fingerprint.html", "fingerprint_sink.png",
              "fingerprint_frequency.png", "fingerprint_positional.png", "fingerprint_massive.png",
              "fingerprint_slash.png"):
        assert (out / f).is_file(), f
    s = json.loads((out / "fingerprint.json").read_text())
    assert [m["name"] for m in s["models"]] == ["gemma3", "phi3"]
    for m in s["models"]:
        assert (out / m["scans"]["text"] / "maps.safetensors").is_file()
        assert (out / m["scans"]["random"] / "maps.safetensors").is_file()
        assert len(m["layers"]) == m["num_layers"] == 2
        for r in m["layers"]:
            assert len(r["sink_heads"]) == m["num_heads"] and 0 <= r["sink_share"] <= 1
            shares = sum(r["freq"].values())
            assert shares == pytest.approx(1.0, abs=1e-9)
        assert "line" not in m  # numbers only: the one line per model is rendered (tests/report)
    assert "lines" not in s and json.loads((out / "summary.json").read_text())["readings"] == []
    html = (out / "fingerprint.html").read_text()
    assert "gemma3" in html and "phi3" in html and "data:image/png;base64," in html
    assert "<script" not in html


def test_layer_types_and_partial_rotary(two_models):
    out, _ = two_models
    gemma, phi = json.loads((out / "fingerprint.json").read_text())["models"]
    assert [r["type"] for r in gemma["layers"]] == ["sliding_attention", "full_attention"]
    assert set(gemma["layer_types"]) == {"sliding_attention", "full_attention"}
    assert gemma["layer_types"]["full_attention"]["layers"] == 1
    assert phi["layer_types"] == {}
    # Phi-3 rotates half of each head: the other half's energy is 'unrotated', and its dims carry no band
    assert all(r["freq"]["unrotated"] > 0 for r in phi["layers"])
    assert all(r["freq"]["unrotated"] == 0 for r in gemma["layers"])


def test_terminal_output_fits_80_columns(two_models):
    _, stdout = two_models
    assert "fingerprint:" in stdout and "sliding: sink heads, text" in stdout
    assert max(len(line) for line in stdout.splitlines()) <= 80


def test_result_object_reads_back(two_models):
    from poslens.analysis.fingerprint import load_fingerprint

    out, _ = two_models
    r = load_fingerprint(out)
    assert [m["name"] for m in r.models] == ["gemma3", "phi3"]
    t = r.table()
    assert list(t["model"]) == ["gemma3", "gemma3", "phi3", "phi3"] and "sink_share" in t and "freq_low" in t
    assert list(r.table("model")["model"]) == ["gemma3", "phi3"]
    sink = r.tensors["gemma3"]["sink"]
    assert sink.shape == (2, 4)
    assert torch.allclose(sink.double(), torch.tensor([x["sink_heads"] for x in r.models[0]["layers"]],
                                                      dtype=torch.float64), atol=1e-6)


def test_model_names_unique_and_safe():
    from poslens.capture.model.source import model_names

    assert model_names(["/a/m.gguf", "/b/m.gguf", "/c/m", "/d/we ird"]) == ["m", "m-2", "m-3", "we_ird"]


def test_errors(cli, tmp_path, two_models):
    out, _ = two_models
    code, _, err = cli("fingerprint", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert code == 2 and err.startswith("poslens: error:") and "nope" in err and len(err.splitlines()) == 1
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    model = out.parent / "phi3"
    code, _, err = cli("fingerprint", str(model), "--out", str(tmp_path / "full"))
    assert code == 2 and "--overwrite" in err
    code, _, err = cli("fingerprint", str(model), "--out", str(tmp_path / "full"), "--overwrite")
    assert code == 2 and err.startswith("poslens: error:")  # a directory holding no fingerprint is never replaced
    assert (tmp_path / "full" / "notes.txt").read_text() == "mine"
    code, _, err = cli("fingerprint", str(model), "--out", str(tmp_path / "o2"), "--eps", "1.5")
    assert code == 2 and "--eps" in err


def test_page_renders_in_chromium(two_models, tmp_path):
    from tests.report.test_report import chromium_status

    out, _ = two_models
    status, console = chromium_status((out / "fingerprint.html").read_text(), tmp_path)
    assert status["errors"] == [], status["errors"]
    assert status["images"] == 5 and status["broken"] == 0
    assert console == "", console


def test_page_defines_every_column_of_every_table(two_models):
    """Every table of the page (traits, traits per layer type, slash heads, massive dims) is followed by
    the definitions of its columns, one per header, in the report's markup (tests/report/test_columns.py)."""
    from poslens.reporting.fingerprint import render_page
    from tests.report.test_columns import page_tables

    out, _ = two_models
    s = json.loads((out / "fingerprint.json").read_text())
    for html in ((out / "fingerprint.html").read_text(), render_page(s, figures=False)[0]):
        tables = page_tables(html)
        assert len(tables) == 6 and html.count("<table>") == len(tables)  # traits, gemma3's types, 2 x 2 per model
        for cols, defined in tables:
            assert cols and all(c.strip() for c in cols) and cols == defined, (cols, defined)
        assert '<th scope="col">sliding_attention</th>' in html and '<dl class="coldefs">' in html


def _record(**over):
    """A model record with known numbers: 4 layers x 2 heads, every field the findings read."""
    layers = [{"layer": l, "rope": True, "nonrelative_p": 1e-4, "flat": False, "aps_mean": 0.75, "aps_std": 0.05,
               "freq_heads": {"high": [0.1, 0.1], "medium": [0.1, 0.1], "low": [0.8, 0.8], "unrotated": [0, 0]},
               "dims_by_band": {"high": 2, "medium": 2, "low": 4, "unrotated": 0}} for l in range(4)]
    overall = {"sink_rate": 0.5, "sink_rate_random": 0.5, "relativity_median": 0.9, "aps_min": 0.55, "aps_max": 0.65,
               "freq": {"high": 0.1, "medium": 0.1, "low": 0.8, "unrotated": 0.0}, "massive_q": 12, "massive_k": 0,
               "massive_q_low": 12, "massive_k_low": 0, "massive_q_low_share": 1.0, "massive_k_low_share": None}
    m = {"name": "m", "num_layers": 4, "num_heads": 2, "seq_len": 64, "num_seqs": 16, "massive_lambda": 5.0,
         "layers": layers, "overall": overall, "slash_heads": []}
    for k, v in over.items():
        if k in overall:
            overall[k] = v
        else:
            m[k] = v
    return m


def _judged(m):
    from poslens.metrics.judge.fingerprint import judge_claims

    return {f["claim"]: f["models"][0] for f in judge_claims([m], {"sink_eps": 0.3, "slash_kappa": 0.3})}


def _verdicts(m):
    return {k: r["verdict"] for k, r in _judged(m).items()}


def _head(persists, layer=0, head=0, delta=1):
    return {"layer": layer, "head": head, "delta": delta, "score": 0.6, "score_random": 0.5 if persists else 0.1,
            "persists": persists, "q_top1_energy": 0.9, "k_top1_energy": 0.9, "predicted_delta": delta}


def test_findings_verdicts_follow_the_numbers():
    from poslens.metrics.verdicts import NOT_JUDGED, NOT_REPRODUCED, REPRODUCED

    j = _judged(_record())
    assert j["sink"]["verdict"] == REPRODUCED and j["sink"]["value"] == 0.5
    assert j["kim"]["verdict"] == REPRODUCED and j["kim"]["nonrelative"] == 4  # 4 of 4 layers beyond the noise
    assert (j["slash"]["verdict"], j["slash"]["reason"]) == (NOT_JUDGED, "no_slash_heads")
    assert (j["zuo"]["verdict"], j["zuo"]["reason"]) == (NOT_JUDGED, "all_rope")  # every layer has RoPE
    assert j["barbero"]["verdict"] == REPRODUCED and j["barbero"]["slash_lean_fast"] is None  # 80 % low, no slash head
    # 12 of 12 massive dims low, against 4 of 8 dims by chance
    assert j["jin"]["verdict"] == REPRODUCED and (j["jin"]["value"], j["jin"]["chance"]) == (1.0, 0.5)
    assert all(k in r for r in j.values() for k in ("value", "chance", "floor", "threshold", "verdict", "reason"))
    sink = _judged(_record(sink_rate=0.05))["sink"]
    assert (sink["verdict"], sink["reason"]) == (NOT_JUDGED, "no_bos")
    two_of_three = [_head(True, head=0), _head(True, layer=1, head=1), _head(False, layer=2)]
    slash = _judged(_record(slash_heads=two_of_three))["slash"]
    assert slash["verdict"] == REPRODUCED and (slash["persist"], slash["heads"]) == (2, 3)
    assert _verdicts(_record(slash_heads=[_head(False), _head(False, layer=1)]))["slash"] == NOT_REPRODUCED
    assert _verdicts(_record(massive_q_low=3, massive_q_low_share=0.25))["jin"] == NOT_REPRODUCED
    # 4 of 4 low against 1/2 by chance is within the binomial noise floor at the one-sided level 0.01
    assert _verdicts(_record(massive_q=4, massive_q_low=4))["jin"] == NOT_REPRODUCED
    m = _record()
    for r in m["layers"]:
        r["nonrelative_p"] = 0.5
    assert _verdicts(m)["kim"] == NOT_REPRODUCED
    m = _record()
    for r in m["layers"]:
        r["rope"] = False
    m["layers"][0]["aps_mean"] = 0.5  # mean APS 0.6875: beyond 0.5 and its noise floor by more than 0.1
    assert _verdicts(m)["zuo"] == REPRODUCED
    for r in m["layers"]:
        r["aps_mean"] = 0.55  # beyond the noise floor, but a small effect
    zuo = _judged(m)["zuo"]
    assert (zuo["verdict"], zuo["reason"]) == (NOT_REPRODUCED, "small")
    # slash heads using the fast pairs less than the other heads contradict the paper
    m = _record(slash_heads=[_head(True)])
    m["layers"][0]["freq_heads"]["high"] = [0.0, 0.3]
    barbero = _judged(m)["barbero"]
    assert (barbero["verdict"], barbero["reason"], barbero["slash_lean_fast"]) == (NOT_REPRODUCED, "slash_not_fast",
                                                                                   False)


def test_findings_in_json_and_page(two_models):
    out, _ = two_models
    s = json.loads((out / "fingerprint.json").read_text())
    assert len(s["findings"]) == 6 and all(len(f["models"]) == 2 for f in s["findings"])
    from poslens.metrics.verdicts import VERDICTS

    assert [f["claim"] for f in s["findings"]] == ["sink", "kim", "slash", "zuo", "barbero", "jin"]
    assert all(m["verdict"] in VERDICTS and "text" not in m and "why" not in m for f in s["findings"]
               for m in f["models"])
    html = (out / "fingerprint.html").read_text()
    assert html.index("Key findings") < html.index("One line per model")


def test_overwrite_replaces_a_previous_fingerprint(cli, tmp_path, two_models, ids_file):
    out, _ = two_models
    model = out.parent / "phi3"
    args = ("fingerprint", str(model), "--out", str(tmp_path / "fp"), "--data", str(ids_file), "--seq-len", str(S),
            "--num-seqs", "2", "--no-figures", "--quiet", "--threads", "1")
    assert cli(*args)[0] == 0
    code, _, err = cli(*args)
    assert code == 2 and "--overwrite" in err
    (tmp_path / "fp" / "scans" / "stale").mkdir()  # not written by poslens: --overwrite refuses, naming it
    code, _, err = cli(*args, "--overwrite")
    assert code == 2 and "scans/stale" in err and (tmp_path / "fp" / "scans" / "stale").is_dir()
    (tmp_path / "fp" / "scans" / "stale").rmdir()
    stale = tmp_path / "fp" / "scans" / "phi3" / "text" / "maps.safetensors"
    before = stale.stat().st_ino
    code, _, err = cli(*args, "--overwrite")
    assert code == 0, err
    assert stale.stat().st_ino != before  # the earlier run's scans were replaced, not kept
    assert json.loads((tmp_path / "fp" / "config.json").read_text())["command"] == "fingerprint"
    assert json.loads((tmp_path / "fp" / "summary.json").read_text())["command"] == "fingerprint"


def test_python_call_without_out_then_save(tmp_path, two_models, ids_file):
    from poslens.analysis.fingerprint import fingerprint, load_fingerprint
    from poslens.reporting.fingerprint import fingerprint_page

    out, _ = two_models
    r = fingerprint(out.parent / "phi3", data=ids_file, seq_len=S, num_seqs=2, progress=False, page=fingerprint_page)
    assert r.path is None and [m["name"] for m in r.models] == ["phi3"]
    assert r.table().shape[0] == 2
    saved = r.save(tmp_path / "kept", figures=False)
    back = load_fingerprint(saved)
    assert back.models[0]["overall"] == r.models[0]["overall"]
    assert torch.equal(back.tensors["phi3"]["sink"], r.tensors["phi3"]["sink"])
    assert (saved / "fingerprint.html").is_file() and not (saved / "fingerprint_sink.png").exists()


def test_nope_layers_are_their_own_type(tmp_path, ids_file):
    """SmolLM3 leaves RoPE out of every other layer: those layers are the type no_rope, all their q·k
    energy is unrotated, the model's RoPE usage averages the rotating layers only, and the Zuo et al.
    finding (a claim about layers without positional encoding) is judged on them."""
    from poslens.analysis.fingerprint import fingerprint

    model = save_tiny("smollm3", tmp_path / "smollm3", layers=4)
    r = fingerprint(model, data=ids_file, seq_len=S, num_seqs=N, progress=False, out=tmp_path / "fp", figures=False)
    m = r.models[0]
    assert [(x["type"], x["rope"]) for x in m["layers"]] == [("rope", True), ("no_rope", False)] * 2
    assert all(x["freq"]["unrotated"] == pytest.approx(1.0) for x in m["layers"] if not x["rope"])
    assert set(m["layer_types"]) == {"rope", "no_rope"}
    o = m["overall"]["freq"]
    assert o["unrotated"] == pytest.approx(0.0) and o["high"] + o["medium"] + o["low"] == pytest.approx(1.0)
    zuo = next(f for f in r.summary["findings"] if f["claim"] == "zuo")
    assert zuo["models"][0]["verdict"] != "not_judged" and zuo["models"][0]["value"] is not None
