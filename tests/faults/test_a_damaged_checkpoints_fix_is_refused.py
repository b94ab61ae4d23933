"""Cause: a damaged checkpoint's message said "delete it and rerun without --resume", and doing exactly that
was refused (the run directory is not empty). The message names the fix that works, ``--overwrite``, and
following it scans again from the start."""

from __future__ import annotations

import json

from faultkit import SCAN, one_error


def test_the_damaged_checkpoints_fix_works(cli, tiny, tmp_path):
    from poslens.capture.scan.options import ScanConfig
    from poslens.capture.scan.run import run_scan

    out = tmp_path / "o"
    cfg = ScanConfig(model_dir=str(tiny), out=str(out), data="random", seq_len=8, num_seqs=4, batch_size=1,
                     checkpoint_every=1, figures=False)
    run_scan(cfg, progress=False, stop_after_batches=2)
    ck = out / "checkpoint.safetensors"
    ck.write_bytes(ck.read_bytes()[: ck.stat().st_size // 2])
    args = [a for a in SCAN if a not in ("--num-seqs", "2")] + ["--num-seqs", "4", "--batch-size", "1"]
    code, _, err = cli("scan", tiny, "--out", out, *args, "--resume")
    msg = one_error(code, err, "checkpoint", "--overwrite")
    assert "without --resume" not in msg
    code, _, err = cli("scan", tiny, "--out", out, *args, "--overwrite")
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["num_seqs"] == 4
