"""Data-parallel ``poslens scan`` under torchrun (2 CPU processes, gloo) and ``--device-map auto``.

The distributed result must equal the single-process scan of the same data (the same per-batch
contributions, summed in another order: float64 sums, float32 maps, <= 1e-6 relative), also after
one rank was SIGKILLed mid-run and the job resumed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from poslens.capture.scan import distributed as D
from poslens.capture.scan.checkpoint import check_resume_layout
from poslens.capture.scan.options import ScanConfig
from poslens.capture.scan.run import run_scan
from poslens.errors import PoslensError
from poslens.rundir.io import read_tensors
from tests.capture.test_capture import save_tiny

# 5 batches of 2 sequences: rank 0 gets batches 0, 2, 4 and rank 1 gets 1, 3 (uneven on purpose)
# a q/k reservoir of 50 of the 160 token slots: the ranks' samples must merge into the single-process one
OPTS = dict(data="random", seq_len=16, num_seqs=10, batch_size=2, seed=5, checkpoint_every=1, reservoir=50,
            keep_checkpoint=True)
ARGS = ["--data", "random", "--seq-len", "16", "--num-seqs", "10", "--batch-size", "2", "--seed", "5",
        "--checkpoint-every", "1", "--reservoir", "50", "--no-figures", "--quiet", "--keep-checkpoint"]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny("llama", tmp_path_factory.mktemp("llama") / "m")


@pytest.fixture(scope="module")
def reference(llama_dir, tmp_path_factory):
    """The single-process scan of the same data."""
    out = tmp_path_factory.mktemp("single") / "run"
    run_scan(ScanConfig(model_dir=str(llama_dir), out=str(out), figures=False, **OPTS), progress=False)
    return out


def torchrun(model, out, *extra, env_extra=None, timeout=150):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", "localhost:0", "-m", "poslens", "scan", str(model), "--out", str(out), *ARGS, *extra]
    env = {k: v for k, v in os.environ.items() if k != D.DIE_HOOK_ENV}
    env.update({"OMP_NUM_THREADS": "1", "POSLENS_DIST_TIMEOUT": "60", **(env_extra or {})})
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def assert_maps_close(a_dir, b_dir, rtol=1e-6):
    a = read_tensors(a_dir / "maps.safetensors")
    b = read_tensors(b_dir / "maps.safetensors")
    assert set(a) == set(b)
    for k in a:
        scale = a[k].double().abs().max().clamp_min(1e-30)
        rel = ((a[k].double() - b[k].double()).abs().max() / scale).item()
        assert rel <= rtol, (k, rel)


def test_shards_are_disjoint_and_cover_every_batch():
    for n in (0, 1, 5, 7, 64):
        for w in (1, 2, 3, 8):
            parts = [D.shard(n, r, w) for r in range(w)]
            flat = sorted(b for p in parts for b in p)
            assert flat == list(range(n)), (n, w)
            assert max(map(len, parts)) == len(parts[0])  # rank 0 has the most: the step count


def test_two_processes_equal_single_process(llama_dir, reference, tmp_path):
    out = tmp_path / "dist"
    res = torchrun(llama_dir, out)
    assert res.returncode == 0, res.stderr[-3000:]
    assert_maps_close(reference, out)
    # the merged float64 sums and counts equal the single-process checkpoint's
    a = read_tensors(reference / "checkpoint.safetensors")
    b = read_tensors(out / "checkpoint.safetensors")
    for k in a:
        if k.endswith(".count"):
            assert torch.equal(a[k], b[k]), k
        else:
            assert torch.allclose(a[k], b[k], rtol=1e-12, atol=1e-12 * a[k].abs().max().item()), k
    # the merged reservoir keeps exactly the single-process slots (50 of 160)
    assert torch.equal(a["reservoir.tokens"], b["reservoir.tokens"]) and int((b["reservoir.tokens"][:, 0] >= 0).sum()) == 50
    # each rank checkpointed only its own shard
    counts = [int(read_tensors(out / D.checkpoint_name(r))["scores.count"]) for r in (0, 1)]
    assert counts == [6, 4]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_seqs"] == 10 and summary["throughput"]["processes"] == 2
    assert summary["throughput"]["tokens"] == 10 * 16
    assert json.loads((out / "config.json").read_text())["world_size"] == 2
    # rank 0 alone wrote the run directory: nothing but these files (and its record of them)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [".poslens-files.json", "config.json", "maps.safetensors", "summary.json", "checkpoint.safetensors",
         D.checkpoint_name(0), D.checkpoint_name(1)])


def test_killed_rank_fails_naming_it_and_resume_matches_single_process(llama_dir, reference, tmp_path):
    out = tmp_path / "killed"
    # rank 1 SIGKILLs itself after its first batch (and that batch's checkpoint)
    res = torchrun(llama_dir, out, env_extra={D.DIE_HOOK_ENV: "1:1"})
    assert res.returncode != 0
    err = res.stderr
    assert "rank      : 1 (local_rank: 1)" in err and "SIGKILL" in err, err[-3000:]  # torchrun's summary
    # the surviving rank 0 says why it stops: its collective failed and rank 1 never reached the step
    # (or, if torchrun's SIGTERM came first, that it was stopped); never a bare traceback
    assert "poslens: error: rank 0/2" in err, err[-3000:]
    if "lost the other ranks" in err:
        assert "rank 1 never reached batch step 1" in err, err[-3000:]
    else:
        assert "stopped by SIGTERM" in err, err[-3000:]
    assert not (out / "maps.safetensors").exists()
    ck1 = read_tensors(out / D.checkpoint_name(1))  # intact, loadable: rank 1's first batch
    assert int(ck1["scores.count"]) == 2
    # resuming with another world size is refused (the shards would differ)
    with pytest.raises(PoslensError, match="2-process distributed scan"):
        run_scan(ScanConfig(model_dir=str(llama_dir), out=str(out), resume=True, figures=False, **OPTS),
                 progress=False)
    with pytest.raises(PoslensError, match="relaunch with 2 processes"):
        check_resume_layout(out, 3)
    res = torchrun(llama_dir, out, "--resume")
    assert res.returncode == 0, res.stderr[-3000:]
    assert_maps_close(reference, out)
    assert json.loads((out / "summary.json").read_text())["num_seqs"] == 10


def test_device_map_auto_equals_plain_scan(llama_dir, reference, tmp_path):
    """On a CPU-only machine accelerate maps every module to the CPU; the tensors must not change."""
    if torch.cuda.is_available():
        pytest.skip("accelerate maps the model to the visible GPU here (bench_gpu.py's dist part covers it)")
    out = tmp_path / "dm"
    summary = run_scan(ScanConfig(model_dir=str(llama_dir), out=str(out), figures=False, device_map="auto",
                                  **OPTS), progress=False)
    assert summary["num_seqs"] == 10
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["device_map"] == {"": "cpu"} and cfg["device"] == "cpu"
    assert_maps_close(reference, out)


def test_device_map_capture_moves_tensors_to_the_accumulators():
    """The device-map capture accumulates exactly what Capture does (a CPU machine has only one device to
    move to, so this checks the wrapper's plumbing; the moves themselves need a GPU)."""
    from poslens.capture.engine.capture import Capture
    from poslens.capture.engine.spec import CaptureSpec

    spec = CaptureSpec(num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4, seq_len=6, layers=[0])
    torch.manual_seed(0)
    q, k, o = torch.randn(2, 2, 6, 4), torch.randn(2, 1, 6, 4), torch.randn(2, 2, 6, 4)
    h = torch.randn(2, 6, 8)
    plain, moved = Capture(spec, "cpu"), D.DeviceMapCapture(spec, "cpu")
    for c in (plain, moved):
        c.begin_batch(2)
        c.observe_hidden(0, h)
        c.observe_attention(0, q, k, o, 0.5, causal=True, window=None)
        c.end_batch()
    for name in plain.accs:
        assert torch.equal(plain.accs[name].sum, moved.accs[name].sum), name
    assert moved.device == torch.device("cpu")


def test_bad_device_map_is_refused(llama_dir, tmp_path):
    with pytest.raises(PoslensError, match="device_map='everywhere'"):
        run_scan(ScanConfig(model_dir=str(llama_dir), out=str(tmp_path / "x"), device_map="everywhere", **OPTS),
                 progress=False)
    assert not (tmp_path / "x").exists()
