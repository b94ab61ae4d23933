"""A realistic-depth report check: a random-init 30-layer, tiny-width Llama (SmolLM2-135M's layer
and head counts: 30 layers, 9 query heads, 3 key/value heads; width 72) is scanned, reported, and
the page is photographed in headless Chromium.

    python benchmarks/report_30_layers.py --out /tmp/r30 [--screenshot docs/report-30-layers.png]

Prints the page height and the number of figures and tables, and how many screens (1,000 px) the
page takes. Needs Debian's ``chromium`` for the screenshot (``apt-get install -y chromium``).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--num-seqs", type=int, default=8)
    ap.add_argument("--screenshot", type=Path, default=None,
                    help="PNG to write (the page's top, scaled to 900 px wide)")
    ap.add_argument("--screens", type=float, default=3.0, help="how many 1,000-px screens the screenshot shows")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from transformers import LlamaConfig, LlamaForCausalLM

    from poslens.capture.scan.options import ScanConfig
    from poslens.capture.scan.run import run_scan
    from poslens.reporting import write_report

    model_dir, scan_dir = args.out / "llama30", args.out / "scan_llama30"
    if not (model_dir / "config.json").is_file():
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=256, hidden_size=72, intermediate_size=192, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=1024,
                          tie_word_embeddings=True)
        LlamaForCausalLM(cfg).save_pretrained(str(model_dir))
    t0 = time.time()
    if not (scan_dir / "summary.json").is_file():
        run_scan(ScanConfig(model_dir=str(model_dir), out=str(scan_dir), data="random", seq_len=args.seq_len,
                            num_seqs=args.num_seqs, batch_size=4), progress=False)
    print(f"scan: {time.time() - t0:.0f} s")
    page = write_report([scan_dir], args.out / "report.html", title="30-layer Llama (random init)")
    html = page.read_text()
    print(f"report: {page} ({len(html) / 1e6:.1f} MB), {html.count('<img ')} figures, {html.count('<table')} tables")
    full = args.out / "full.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1400,12000", f"--screenshot={full}", page.as_uri()],
                   check=True, capture_output=True, timeout=180)
    from PIL import Image

    im = Image.open(full).convert("RGB")
    px = im.load()
    bottom = max((y for y in range(0, im.height, 10)
                  if any(px[x, y] != (255, 255, 255) for x in range(0, im.width, 7))), default=0)
    print(f"page height about {bottom} px = {bottom / 1000:.1f} screens of 1,000 px")
    if args.screenshot:
        top = im.crop((0, 0, im.width, min(bottom, int(args.screens * 1000))))
        w = 900
        top = top.resize((w, round(top.height * w / top.width)), Image.LANCZOS)
        top = top.quantize(colors=128, method=Image.Quantize.MEDIANCUT)
        args.screenshot.parent.mkdir(parents=True, exist_ok=True)
        top.save(args.screenshot, optimize=True)
        print(f"wrote {args.screenshot} ({args.screenshot.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
