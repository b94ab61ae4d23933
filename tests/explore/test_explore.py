"""The explorer's data without a browser: block means and chance levels against brute force, the page's
numbers against the run's, the packed float16 maps read back, bad input refused."""

from __future__ import annotations

import base64
import gzip
import json
import re

import numpy as np
import pytest
import torch

import poslens
from poslens.errors import PoslensError
from poslens.explorer.data import block_means, chance_levels, page_data, uniform_offsets


def brute_block_means(x: np.ndarray, S: int, side: int) -> np.ndarray:
    """Block means over the visible (j <= i) entries of full S x S maps, by loops."""
    f = -(-S // side)
    n = -(-S // f)
    out = np.full(x.shape[:-2] + (n, n), np.nan)
    for I in range(n):
        for J in range(n):
            vals = [x[..., i, j] for i in range(I * f, min(S, I * f + f)) for j in range(J * f, min(S, J * f + f))
                    if j <= i]
            if vals:
                out[..., I, J] = np.mean(vals, axis=0)
    return out


@pytest.mark.parametrize("S,side", [(7, 7), (10, 4), (13, 5), (12, 3)])
def test_block_means_of_full_maps_are_the_visible_means(S, side):
    g = torch.Generator(device="cpu").manual_seed(S)
    x = torch.rand(2, 3, S, S, generator=g, dtype=torch.float64, device="cpu").tril()
    got = block_means(x, S, side).numpy()
    np.testing.assert_allclose(got, brute_block_means(x.numpy(), S, side), rtol=1e-12, atol=0)


def test_block_means_of_block_means_weigh_each_block_by_what_it_covers():
    """Maps kept on a grid (``--map-size``) and averaged again equal the direct block means."""
    from poslens.capture.backends.blocks import BlockMaps

    S = 24
    g = torch.Generator(device="cpu").manual_seed(0)
    full = torch.rand(S, S, generator=g, dtype=torch.float64, device="cpu").tril()
    fine = BlockMaps(S, 12)  # blocks of 2
    sums = torch.zeros(fine.n, fine.n, dtype=torch.float64, device="cpu")
    fine.add_rows(sums, full, 0)
    counts = fine.counts(True, None)
    kept = torch.where(counts > 0, sums / counts.clamp_min(1), torch.zeros_like(sums))
    np.testing.assert_allclose(block_means(kept, S, 4).numpy(), brute_block_means(full.numpy(), S, 4), rtol=1e-12)


def test_chance_levels_are_those_of_uniform_causal_attention():
    """Uniform causal attention (A[i, j] = 1/(i+1) for j <= i) read by the metrics' own brute-force code."""
    from poslens.metrics.verdicts import uniform_slash
    from poslens.metrics.slash import slash_profile

    S = 40
    i = np.arange(S)
    A = np.tril(np.ones((S, S))) / (i[:, None] + 1.0)
    np.testing.assert_allclose(uniform_offsets(S), slash_profile(torch.as_tensor(A)).numpy(), rtol=1e-12)
    np.testing.assert_allclose(uniform_offsets(S)[1:], [uniform_slash(S, d) for d in range(1, S)], rtol=1e-12)
    c = chance_levels(S)
    assert c["sink"] == pytest.approx(A[1:, 0].mean(), rel=1e-12)
    assert c["prev_token"] == pytest.approx(np.mean([A[k, k - 1] for k in range(1, S)]), rel=1e-12)
    dist = (A * np.maximum(i[:, None] - i[None, :], 0)).sum(1).mean()
    assert c["distance"] == pytest.approx(dist, rel=1e-12)
    ent = -(np.where(A > 0, A * np.log(np.where(A > 0, A, 1)), 0)).sum(1).mean()
    assert c["entropy"] == pytest.approx(ent, rel=1e-12)


@pytest.fixture(scope="module")
def scan_all_heads(tiny, tmp_path_factory):
    return poslens.scan(str(tiny), data="random", seq_len=24, num_seqs=4, heads="all", progress=False,
                        out=tmp_path_factory.mktemp("explore_scan") / "scan")


def _blob_arrays(data: dict, blob: bytes):
    u16 = np.frombuffer(blob, dtype="<f2")

    def read(ref):
        n = int(np.prod(ref["shape"]))
        return u16[ref["offset"]:ref["offset"] + n].astype(np.float64).reshape(ref["shape"])
    return read


def test_the_pages_numbers_and_maps_are_the_runs(scan_all_heads):
    r = scan_all_heads
    data, blob = page_data([r])
    run = data["runs"][0]
    df = r.heads()
    np.testing.assert_allclose(run["heads"]["sink"], df["sink"], rtol=1e-5)
    np.testing.assert_allclose(run["heads"]["slash_score"], df["slash_score"], rtol=1e-5)
    assert run["heads"]["slash_offset"] == [float(v) for v in df["slash_offset"]]
    np.testing.assert_allclose(run["heads"]["prev_token"], r.maps["slash"][..., 1].reshape(-1), rtol=1e-5)
    read = _blob_arrays(data, blob)
    hm = r.maps["head_maps"]
    got = read(run["maps"]["head_probs"])
    visible = np.tril(np.ones((24, 24), dtype=bool))
    np.testing.assert_array_equal(got[..., visible], hm.half().double().numpy()[..., visible])
    assert np.isnan(got[..., ~visible]).all()
    np.testing.assert_array_equal(read(run["maps"]["profiles"]), r.maps["slash"].half().double().numpy())
    lay = r.layers()
    np.testing.assert_allclose(run["layer_readings"]["relativity_index"]["values"],
                               lay["relativity_index"].astype(float), rtol=1e-5)
    assert run["notes"] == []


def test_the_page_holds_its_data_and_plotly(scan_all_heads, tmp_path):
    page = poslens.explore(scan_all_heads, out=tmp_path / "x.html")
    html = page.path.read_text()
    data, blob = page_data([scan_all_heads])
    packed = re.search(r'<script type="application/octet-stream" id="poslens-blob">([^<]*)</script>', html).group(1)
    assert gzip.decompress(base64.b64decode(packed)) == blob
    shown = json.loads(re.search(r'<script type="application/json" id="poslens-data">(.*?)</script>', html, re.S)
                       .group(1).replace("<\\/", "</"))
    assert shown["runs"][0]["heads"] == data["runs"][0]["heads"]
    code = re.search(r'id="poslens-plotly">([^<]*)</script>', html).group(1)
    assert b"Plotly" in gzip.decompress(base64.b64decode(code))[:20000]
    assert not re.search(r'<(script|link|img)[^>]+(src|href)="https?:', html)  # nothing fetched
    assert "srcdoc=" in page._repr_html_()


def test_bad_input_is_one_error_and_nothing_written(scan_all_heads, tmp_path, cli):
    import shutil

    bad = tmp_path / "damaged"
    shutil.copytree(scan_all_heads.path, bad)
    with open(bad / "maps.safetensors", "r+b") as f:
        f.truncate(100)
    out = tmp_path / "page.html"
    with pytest.raises(PoslensError) as e:
        poslens.explore(bad, out=out)
    msg = str(e.value)
    assert "maps.safetensors" in msg and "\n" not in msg
    assert not out.exists() and list(tmp_path.glob(".page.html*")) == []
    code, _, err = cli("explore", str(bad), "--out", str(out))
    assert code == 2 and len(err.splitlines()) == 1 and not out.exists()
    # a run of another command
    sim = poslens.simulate(samples=50, seq_len=6, dim=8, num_layers=2, progress=False)
    with pytest.raises(PoslensError) as e:
        poslens.explore(sim, out=out)
    msg = str(e.value)
    assert "simulate" in msg and "scan" in msg and not out.exists()
    # a page that exists is kept unless overwrite
    out.write_text("keep")
    code, _, err = cli("explore", str(scan_all_heads.path), "--out", str(out))
    assert code == 2 and out.read_text() == "keep"
    assert cli("explore", str(scan_all_heads.path), "--out", str(out), "--overwrite")[0] == 0
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_a_scan_without_head_maps_says_which_option_adds_them(tiny, tmp_path):
    r = poslens.scan(str(tiny), data="random", seq_len=16, num_seqs=2, progress=False)
    page = r.explore()
    assert len(page.notes) == 1
    msg = page.notes[0]
    assert "--heads all" in msg
