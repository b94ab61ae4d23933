"""The simulator experiments of ``poslens reproduce`` (arXiv 2509.21042 figures) and its index."""

import re

from poslens.conventions import NOISE_P
from poslens.reproduce.simulated import KIM_FIG4_TREND
from poslens.rundir.io import read_json


def test_reproduce_fig1_and_index(cli, tmp_path):
    out = tmp_path / "repro"
    code, stdout, _ = cli("reproduce", "kim-fig1", "--out", out, "--quiet")
    assert code == 0
    idx = read_json(out / "index.json")
    assert idx["experiments"][0]["reproduced"] is True
    assert (out / "kim-fig1" / "kim_fig1.png").exists()
    assert "kim-fig1" in (out / "index.md").read_text()


def test_reproduce_fig4_small(tmp_path):
    from poslens.reproduce import ReproContext, run_reproduction

    rec = run_reproduction("kim-fig4", tmp_path / "r", ReproContext(samples=2000, figures=False))[0]
    assert rec["reproduced"], rec["measured"]
    assert len(rec["runs"]) == 4
    # the sign per alpha, as the paper's figure: lower further right at alpha = 0, higher at alpha = 0.5
    lines = rec["measured"].splitlines()
    a0 = next(x for x in lines if x.startswith("alpha=0, ") and "non-causal" not in x)
    a5 = next(x for x in lines if x.startswith("alpha=0.5, ") and "non-causal" not in x)
    trends0 = [float(t) for t in a0.split("diagonal trend ")[1].split(" vs")[0].split(" / ")]
    assert all(t < 0 for t in trends0)
    assert a5.split("diagonal trend ")[1].startswith("+")
    # layers 1-3 of the causal runs: the sign of the paper's figure, significantly (right lower at alpha = 0,
    # right higher at alpha = 0.5)
    runs = {r["run"]: r for r in rec["runs"]}
    for run, sign in (("rope_causal_alpha0", -1), ("rope_causal_alpha0.5", 1)):
        later = runs[run]["layers"][1:]
        assert len(later) == len(KIM_FIG4_TREND[0.0]) == 3
        assert all(l["diagonal_trend"] * sign > 0 and l["trend_p"] < NOISE_P for l in later), run


def test_reproduce_layernorm_sqrt_d_alpha0_is_flat_as_in_the_paper(tmp_path):
    from poslens.reproduce import EXPERIMENTS, ReproContext

    ctx = ReproContext(samples=2000, figures=False)
    rec = EXPERIMENTS["kim-layernorm"].run(ctx, tmp_path / "ln")
    flat = next(r for r in rec["runs"] if r["run"] == "layernorm_sqrt-d_alpha0")
    assert flat["layers"] and all(l["relativity_index"] is None for l in flat["layers"])  # flat in every layer
    assert rec["reproduced"], rec["measured"]  # ... as in the paper's own figure, and the other settings local
    assert any("LN/sqrt-d" in x and x.startswith("alpha=0, ") for x in rec["measured"].splitlines())


def test_reproduce_fig1_says_rounded_and_truncated(tmp_path):
    from poslens.reproduce import EXPERIMENTS, ReproContext

    rec = EXPERIMENTS["kim-fig1"].run(ReproContext(figures=False), tmp_path / "f1")
    printed = {(ours, paper): how for ours, paper, how in re.findall(r"(\d\.\d{4}) as (\d\.\d{3}) \((\w+)\)", rec["note"])}
    assert printed == {("0.1535", "0.154"): "rounded", ("0.1321", "0.132"): "rounded", ("0.1508", "0.150"): "truncated"}


def test_reproduce_unknown_name(cli, tmp_path):
    code, _, err = cli("reproduce", "kim-fig9", "--out", tmp_path / "r", "--quiet")
    assert code == 2 and "kim-fig9" in err
    assert not (tmp_path / "r").exists()


def test_repro_progress_follows_the_progress_convention(tmp_path):
    """``ReproContext.progress`` is called as ``update(done, total=None, info="")`` (poslens.progress):
    the callable a ``task_progress`` block yields can be passed as it is, ``info`` naming the run."""
    from poslens.progress import task_progress
    from poslens.reproduce import EXPERIMENTS, ReproContext

    calls = []

    def update(done, total=None, info=""):
        calls.append((done, total, info))

    EXPERIMENTS["kim-layernorm"].run(ReproContext(samples=500, figures=False, progress=update), tmp_path / "a")
    assert calls and all(isinstance(d, int) and t == 500 and isinstance(i, str) and i for d, t, i in calls)
    assert {d for d, _, _ in calls} >= {500}  # every simulation ends at its total
    with task_progress("reproduce", 500, enabled=False) as bar:  # the convention's own callable fits
        EXPERIMENTS["kim-layernorm"].run(ReproContext(samples=500, figures=False, progress=bar), tmp_path / "b")
