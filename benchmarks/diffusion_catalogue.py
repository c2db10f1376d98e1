"""Diffusers models of many classes, each saved as ``save_pretrained`` writes it (small configs, random weights,
nothing downloaded) and exported by name through the CLI: ``onnxport export hf:DIR`` with no ``--input``.
Counts proven / refused / not proven, with each one's first line, exit code and seconds.

A new ControlNet's output convolutions start at zero (so do its outputs, which no comparison can tell from
anything): they are given random weights here, as a trained ControlNet has.

    .venv/bin/python benchmarks/diffusion_catalogue.py                 # every class; writes the results file
    .venv/bin/python benchmarks/diffusion_catalogue.py --only unet-sdxl --only flux
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "diffusion_catalogue.json"

U = dict(block_out_channels=(16, 32), layers_per_block=1, norm_num_groups=8, sample_size=8)
CROSS = dict(U, in_channels=4, out_channels=4, cross_attention_dim=16, attention_head_dim=8,
             down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
             up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))
MMDIT = dict(sample_size=8, patch_size=2, in_channels=4, attention_head_dim=8, num_attention_heads=2,
             joint_attention_dim=16, caption_projection_dim=16, out_channels=4)
FLUX = dict(patch_size=1, in_channels=8, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=16, pooled_projection_dim=8, axes_dims_rope=(4, 6, 6))


def models() -> dict[str, Callable]:
    import diffusers as d

    return {
        "unet-sd": lambda: d.UNet2DConditionModel(**CROSS),
        "unet-sdxl": lambda: d.UNet2DConditionModel(**CROSS, addition_embed_type="text_time",
                                                    addition_time_embed_dim=8,
                                                    projection_class_embeddings_input_dim=8 * 6 + 16),
        "unet-lcm": lambda: d.UNet2DConditionModel(**CROSS, time_cond_proj_dim=16),
        "unet2d-class": lambda: d.UNet2DModel(**U, in_channels=3, out_channels=3, num_class_embeds=10,
                                              down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                                              up_block_types=("AttnUpBlock2D", "UpBlock2D"), attention_head_dim=8),
        "vae-kl": lambda: d.AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(16, 32),
                                          layers_per_block=1, norm_num_groups=8, sample_size=16,
                                          down_block_types=("DownEncoderBlock2D",) * 2,
                                          up_block_types=("UpDecoderBlock2D",) * 2),
        "vae-tiny": lambda: d.AutoencoderTiny(encoder_block_out_channels=(8, 8), decoder_block_out_channels=(8, 8),
                                              num_encoder_blocks=(1, 1), num_decoder_blocks=(1, 1), latent_channels=4),
        "dit": lambda: d.DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4,
                                               num_layers=1, sample_size=8, patch_size=2, num_embeds_ada_norm=10,
                                               norm_num_groups=8),
        "pixart": lambda: d.PixArtTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4,
                                                     out_channels=8, num_layers=1, cross_attention_dim=16,
                                                     sample_size=8, patch_size=2, caption_channels=24),
        "sana": lambda: d.SanaTransformer2DModel(in_channels=4, out_channels=4, num_attention_heads=2,
                                                 attention_head_dim=8, num_layers=1, num_cross_attention_heads=2,
                                                 cross_attention_head_dim=8, cross_attention_dim=16,
                                                 caption_channels=24, sample_size=8),
        "sd3": lambda: d.SD3Transformer2DModel(**MMDIT, num_layers=1, pooled_projection_dim=8, pos_embed_max_size=8),
        "flux": lambda: d.FluxTransformer2DModel(**FLUX),
        "flux-dev": lambda: d.FluxTransformer2DModel(**FLUX, guidance_embeds=True),
        "auraflow": lambda: d.AuraFlowTransformer2DModel(**MMDIT, num_mmdit_layers=1, num_single_dit_layers=1,
                                                         pos_embed_max_size=16),
        "controlnet": lambda: d.ControlNetModel(in_channels=4, block_out_channels=(16, 32), layers_per_block=1,
                                                cross_attention_dim=16, attention_head_dim=8, norm_num_groups=8,
                                                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                                conditioning_embedding_out_channels=(8, 16)),
        "sd3-controlnet": lambda: d.SD3ControlNetModel(**MMDIT, num_layers=1, pooled_projection_dim=8,
                                                       pos_embed_max_size=8),
        "flux-controlnet": lambda: d.FluxControlNetModel(**FLUX),
        "hunyuan-dit": lambda: d.HunyuanDiT2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4,
                                                   patch_size=2, sample_size=8, hidden_size=16, num_layers=1,
                                                   cross_attention_dim=16, cross_attention_dim_t5=16,
                                                   pooled_projection_dim=16, text_len=8, text_len_t5=8),
    }


def save(name: str, build: Callable, folder: Path) -> None:
    import torch

    torch.manual_seed(0)
    model = build().eval()
    with torch.no_grad():
        for pname, param in model.named_parameters():
            if pname.startswith("controlnet_") and not param.abs().sum():
                param.copy_(torch.randn_like(param) * 0.1)
    model.save_pretrained(str(folder))


def one(name: str, build: Callable, work: Path, timeout: float) -> dict:
    folder = work / name
    try:
        save(name, build, folder)
    except Exception as e:  # noqa: BLE001 - a config this diffusers cannot build is a row, not a crash
        return {"name": name, "outcome": "not built", "line": str(e).splitlines()[0][:300]}
    t = time.perf_counter()
    cmd = [sys.executable, "-m", "onnxport", "export", f"hf:{folder}", "-o", str(work / f"out-{name}"), "--json"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"name": name, "outcome": "timeout", "seconds": timeout}
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    outcome = {0: "proven", 1: "not proven", 2: "refused", 3: "export failed"}.get(proc.returncode, "crashed")
    return {"name": name, "outcome": outcome, "exit": proc.returncode, "seconds": round(time.perf_counter() - t, 1),
            "line": (lines[0] if lines else "")[:400]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    import diffusers
    import torch

    chosen = {k: v for k, v in models().items() if not args.only or k in args.only}
    work = Path(tempfile.mkdtemp(prefix="diffusion-catalogue-"))
    rows = []
    try:
        for name, build in chosen.items():
            rows.append(one(name, build, work, args.timeout))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    result = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "created_at": time.strftime("%Y-%m-%d"),
              "machine": f"{platform.machine()}, {platform.processor() or ''}".strip(", "),
              "torch": torch.__version__, "diffusers": diffusers.__version__, "summary": counts, "models": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
