"""Decode tokens/s of the proven best decoder on a device against Hugging Face eager ``generate`` (fp16 on a GPU)
and, when ``onnxruntime_genai`` is importable, against its model builder's output on the same model.

    python benchmarks/decoder_gpu.py --device cuda --json out.json   # ~100M Llama shape, random weights
    python benchmarks/decoder_gpu.py --smoke --json out.json         # a tiny model on the CPU: every path once

A device script imports it and calls ``run(device)`` (a dict). The model: 12 layers, hidden 768, 12 heads, 4 kv
heads, intermediate 2048, vocab 32000, random weights; 128 new tokens after a 32-token prompt at batch 1 and 8.
onnxport's side: exported on the CPU, proven on the device (step cases and greedy generation against
``model.generate`` there), its decoder variants (fp16, GQA, CUDA graph on a GPU) made and re-proven, and the
best passing one timed by the greedy loop that keeps the cache on the device (IO binding). Targets on a GPU:
≥ 8× HF eager fp16 at batch 1, ≥ 4× at batch 8, and ahead of the GenAI builder's fp16 model.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

FULL = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
            intermediate_size=2048, vocab_size=32000, max_position_embeddings=512)
SMOKE = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=128, max_position_embeddings=512)  # head size 16: GQA's least
BATCHES = (1, 8)
PROMPT, NEW = 32, 128
SMOKE_PROMPT, SMOKE_NEW = 8, 4
GPU_VARIANTS = "gqa,fp16,cuda-graph"
CPU_VARIANTS = "gqa"
TARGETS = {1: 8.0, 8: 4.0}


def build(config: dict):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**config)).eval()


def hf_generate(model, device: str, batch: int, prompt: int, new: int, repeats: int) -> float:
    """Hugging Face eager ``generate`` tokens/s (greedy, ``new`` tokens, no stop), fp16 on a GPU: the fastest of
    ``repeats`` runs, the first token's call subtracted."""
    from transformers import GenerationConfig

    dtype = torch.float16 if device == "cuda" else torch.float32
    moved = model.to(device=device, dtype=dtype)
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, model.config.vocab_size, (batch, prompt))).to(device)

    def call(n: int) -> float:
        config = GenerationConfig(do_sample=False, max_new_tokens=n, min_new_tokens=n, use_cache=True,
                                  eos_token_id=None, pad_token_id=0, bos_token_id=None)
        _sync(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            moved.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
        _sync(device)
        return time.perf_counter() - t0

    try:
        call(2)
        first = min(call(1) for _ in range(repeats))
        total = min(call(1 + new) for _ in range(repeats))
    finally:
        model.to(device="cpu", dtype=torch.float32)
    return batch * new / max(total - first, 1e-9)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def onnxport_best(model, out: Path, device: str, prompt: int, new: int, repeats: int) -> dict:
    """Export on the CPU, prove on ``device``, make and re-prove the variants there, and time the best passing
    one at each batch with the cache kept on the device."""
    from onnxport import decoder
    from onnxport.core.options import RuntimeOptions
    from onnxport.decoder.records import CacheVariants
    from onnxport.decoder.variants import decode_speed
    from onnxport.runtime.binding import Target
    from onnxport.runtime.variant_sessions import SessionOptions

    target = Target.of(RuntimeOptions(device=device))
    names = GPU_VARIANTS if device == "cuda" else CPU_VARIANTS
    t0 = time.perf_counter()
    max_length = max(prompt + new + 8, 24)
    outcome = decoder.run_model(model, out, max_length=max_length, new_tokens=min(32, max_length - prompt - 4),
                                target=target, variants=CacheVariants(names="export," + names, seq=prompt))
    made = outcome.variants
    row: dict = {"proven": outcome.passed, "seconds": time.perf_counter() - t0, "device": device,
                 "variants": None if made is None else made.to_dict()}
    best = None if made is None else made.best
    if best is None or best.path is None:
        return {**row, "best": None}
    sess = (target.with_options(SessionOptions.from_dict(best.session_options)) if best.session_options
            else target).session(best.path)
    row["best"] = best.name
    for b in BATCHES:
        row[f"tok_s_b{b}"] = decode_speed(sess, outcome.layout, batch=b, prompt=prompt, tokens=new,
                                          repeats=repeats, target=Target.of_session(sess))[1]
    return row


def genai_builder(model, work: Path, device: str, prompt: int, new: int, repeats: int) -> dict:
    """onnxruntime-genai's model builder (``-p fp16 -e cuda``; fp32 on the CPU) on the same weights, timed by
    its own generator; ``{"available": False}`` when it is not importable."""
    if importlib.util.find_spec("onnxruntime_genai") is None:
        return {"available": False}
    import onnxruntime_genai as og

    src, dst = work / "hf", work / "genai"
    model.save_pretrained(src)
    precision, provider = ("fp16", "cuda") if device == "cuda" else ("fp32", "cpu")
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(src), "-o", str(dst),
           "-p", precision, "-e", provider, "-c", str(work / "cache")]
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if built.returncode != 0:
        return {"available": True, "error": built.stderr[-1500:]}
    og_model = og.Model(str(dst))
    row: dict = {"available": True, "command": " ".join(cmd[1:])}
    for b in BATCHES:
        ids = np.random.default_rng(0).integers(0, model.config.vocab_size, (b, prompt)).astype(np.int32)
        _genai_call(og, og_model, ids, 2)
        first = min(_genai_call(og, og_model, ids, 1) for _ in range(repeats))
        total = min(_genai_call(og, og_model, ids, 1 + new) for _ in range(repeats))
        row[f"tok_s_b{b}"] = b * new / max(total - first, 1e-9)
    return row


def _genai_call(og, og_model, ids: np.ndarray, n: int) -> float:
    """Seconds of one GenAI generation of ``n`` greedy tokens after the prompt ``ids``."""
    prompt = ids.shape[1]
    params = og.GeneratorParams(og_model)
    params.set_search_options(max_length=prompt + n, min_length=prompt + n, do_sample=False)
    gen = og.Generator(og_model, params)
    t0 = time.perf_counter()
    gen.append_tokens(ids)
    while not gen.is_done():
        gen.generate_next_token()
    return time.perf_counter() - t0


def run(device: str, *, smoke: bool = False, repeats: int = 3) -> dict:
    """Every measurement on ``device`` ("cuda" or "cpu") in one dict: HF eager, onnxport's proven best and the
    GenAI builder's model, tokens/s at batch 1 and 8, and each ratio against HF eager. ``smoke``: a tiny model,
    a few tokens, one repeat (every path once)."""
    prompt, new = (SMOKE_PROMPT, SMOKE_NEW) if smoke else (PROMPT, NEW)
    repeats = 1 if smoke else repeats
    model = build(SMOKE if smoke else FULL)
    result: dict = {"device": device, "smoke": smoke, "prompt": prompt, "new_tokens": new,
                    "params_m": sum(p.numel() for p in model.parameters()) / 1e6}
    result["hf_eager"] = {f"tok_s_b{b}": hf_generate(model, device, b, prompt, new, repeats) for b in BATCHES}
    result["hf_eager"]["dtype"] = "float16" if device == "cuda" else "float32"
    with tempfile.TemporaryDirectory(prefix="onnxport-decoder-gpu-") as tmp:
        result["onnxport"] = onnxport_best(model, Path(tmp) / "out", device, prompt, new, repeats)
        try:
            result["genai"] = genai_builder(model, Path(tmp), device, prompt, new, repeats)
        except Exception as e:  # noqa: BLE001 - the comparison is recorded, never fatal
            result["genai"] = {"available": True, "error": f"{type(e).__name__}: {e}"[:1500]}
    for b in BATCHES:
        ours, eager = result["onnxport"].get(f"tok_s_b{b}"), result["hf_eager"][f"tok_s_b{b}"]
        genai = result["genai"].get(f"tok_s_b{b}")
        result[f"vs_hf_b{b}"] = ours / eager if ours else None
        result[f"vs_genai_b{b}"] = ours / genai if ours and genai else None
        result[f"target_b{b}"] = TARGETS[b]
    return result


def gpu_check(work: Path, smoke: bool) -> dict:
    """benchmarks/gpu_check.py's decoder check: :func:`run` on CUDA (``smoke``: the tiny model on the CPU);
    ``work`` is not needed (the files go to a temporary folder)."""
    return run("cpu" if smoke else "cuda", smoke=smoke)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--smoke", action="store_true", help="a tiny model, a few tokens, one repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="write the result here (with its command)")
    args = ap.parse_args()
    result = run(args.device, smoke=args.smoke, repeats=args.repeats)
    result["command"] = " ".join(["python", *sys.argv])
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
