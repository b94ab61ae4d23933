"""SmolLM2 scanned on CUDA equals the same scan on the CPU: every tensor of ``maps.safetensors``, with
every statistic (a scan's default), in float32 and in bf16.

The CPU scan in float32 is the reference. A float32 CUDA scan differs from it by the order of float32
sums alone. A bf16 CUDA scan differs by the model's own bf16 rounding, which moves these means by about
1 % in relative norm: on the CPU, a bf16 scan of the same 4 x 128 tokens lies at most 1.2 % from the
float32 one (the score groups; the maps 0.3 to 0.7 %), so the bf16 bound is four times that. Integer
tensors (the reservoir's tokens, the group counts) are equal. Skipped without CUDA or without the model
(``python -m poslens models fetch``); ``scripts/test-gpu`` runs it.
"""

from __future__ import annotations

import os

import pytest
import torch

from real_models import real_model_file

pytestmark = [pytest.mark.real_model,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SEQ_LEN, NUM_SEQS, BATCH = 128, 4, 2
#: relative Frobenius distance to the float32 CPU scan, per tensor
TOL = {"fp32": 1e-3, "bf16": 5e-2}


def _scan(model_file, out, device: str, dtype: str) -> dict[str, torch.Tensor]:
    from poslens.capture.scan.options import ScanConfig
    from poslens.capture.scan.run import run_scan
    from poslens.rundir.io import read_tensors

    run_scan(ScanConfig(model_dir=str(model_file), out=str(out), data="stdlib", seq_len=SEQ_LEN, num_seqs=NUM_SEQS,
                        batch_size=BATCH, figures=False, device=device, dtype=dtype), progress=False)
    return read_tensors(out / "maps.safetensors")


@pytest.fixture(scope="module")
def cpu_scan(tmp_path_factory):
    f = real_model_file("smollm2")
    threads = torch.get_num_threads()
    torch.set_num_threads(min(16, os.cpu_count() or 1))  # the suite's one thread is for tiny tensors
    try:
        return f, _scan(f, tmp_path_factory.mktemp("cpu") / "scan", "cpu", "fp32")
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_smollm2_on_cuda_equals_the_cpu_scan(dtype, cpu_scan, tmp_path):
    f, ref = cpu_scan
    got = _scan(f, tmp_path / "scan", "cuda", dtype)
    assert set(got) == set(ref)
    far = {}
    for name, r in ref.items():
        x = got[name]
        assert x.shape == r.shape, (name, tuple(x.shape), tuple(r.shape))
        if not r.is_floating_point():
            assert torch.equal(x, r), name
            continue
        assert torch.equal(torch.isnan(x), torch.isnan(r)), name
        r64, x64 = r.double().nan_to_num(), x.double().nan_to_num()
        dist = float((x64 - r64).norm() / r64.norm().clamp_min(1e-30))
        if dist > TOL[dtype]:
            far[name] = dist
    assert not far, f"{dtype} CUDA scan vs float32 CPU scan, relative distance above {TOL[dtype]}: {far}"
