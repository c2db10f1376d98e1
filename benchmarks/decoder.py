"""Decode speed of an exported decoder and its variants against PyTorch eager, side by side in one run.

    python benchmarks/decoder.py                 # ~100M-parameter Llama shape, random weights
    python benchmarks/decoder.py --quick         # a small model: a smoke run in about a minute
    python benchmarks/decoder.py --smoke         # a tiny model, 4 tokens, 1 repeat: every code path, quickly

The model (hidden 768, 12 layers, 12 heads, 4 kv heads, intermediate 2048, vocab 32000) is built from a
LlamaConfig with random weights, exported with its KV cache and proven (``decoder.run_model``), then each variant
is made and re-proven (``decoder.optimize_decoder``). Measured with the same thread count for PyTorch and
onnxruntime: decode tokens/s at batch 1 and 8 (the greedy loop, cache fed back; PyTorch with its DynamicCache and
``model.generate`` for reference) and the latency of a 128-token prompt. Targets: the best variant decodes at
batch 1 at least 2x as fast as eager, the fp32 export at least 1.3x.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import write_results

from onnxport import decoder
from onnxport.bench import best_of
from onnxport.decoder.variants import speed, torch_greedy
from onnxport.runtime.sessions import CPU, session

FULL = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
            intermediate_size=2048, vocab_size=32000, max_position_embeddings=512)
QUICK = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
             intermediate_size=688, vocab_size=8000, max_position_embeddings=512)
SMOKE = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=64, vocab_size=128, max_position_embeddings=512)
BATCHES = (1, 8)
DECODE_PROMPT = 16
LONG_PROMPT = 128
TARGETS = {"best": 2.0, "export": 1.3}


def build(config: dict):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config)).eval()
    return model, sum(p.numel() for p in model.parameters())


def eager_speed(model, layout, batch: int, prompt: int, tokens: int, repeats: int) -> tuple[float, float]:
    """(prompt seconds, decode tokens/s) of PyTorch eager in the same greedy loop, timed as the ONNX files are."""
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, layout.vocab, (batch, prompt), dtype=np.int64))

    def run(n: int) -> list[float]:
        seconds: list[float] = []
        torch_greedy(model, layout, ids, n, seconds)
        return seconds

    return speed(run, batch, tokens, repeats)


def generate_speed(model, layout, batch: int, prompt: int, tokens: int, repeats: int) -> tuple[float, float]:
    """``model.generate`` (greedy, for reference): the fastest call of 1 token, then of 1 + ``tokens``."""
    from transformers import GenerationConfig

    ids = torch.from_numpy(np.random.default_rng(0).integers(0, layout.vocab, (batch, prompt), dtype=np.int64))

    def generate(n: int) -> None:
        config = GenerationConfig(do_sample=False, max_new_tokens=n, min_new_tokens=n, use_cache=True,
                                  eos_token_id=None, pad_token_id=0, bos_token_id=None)
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)

    generate(2)
    first = best_of(lambda: generate(1), repeats)
    total = best_of(lambda: generate(1 + tokens), repeats)
    return first, batch * tokens / max(total - first, 1e-9)


def measure(args, model, layout, made) -> list[dict]:
    rows = []
    for name, timer in (("eager loop", eager_speed), ("eager generate", generate_speed)):
        row = {"name": name, "passed": None, "size_mb": None}
        for b in BATCHES:
            row[f"tok_s_b{b}"] = timer(model, layout, b, DECODE_PROMPT, args.tokens, args.repeats)[1]
        row["prompt128_ms"] = 1000 * timer(model, layout, 1, LONG_PROMPT, 1, args.repeats)[0]
        rows.append(row)
        print(f"  measured {name}", flush=True)
    for v in made.variants:
        if v.path is None:
            rows.append({"name": v.name, "passed": False, "error": v.error})
            continue
        sess = session(v.path, providers=[CPU], threads=args.threads)
        row = {"name": v.name, "passed": v.passed, "size_mb": v.size_bytes / 1e6, "cosine": v.cosine,
               "top1": v.top1, "error": v.error}
        for b in BATCHES:
            row[f"tok_s_b{b}"] = decoder.decode_speed(sess, layout, batch=b, prompt=DECODE_PROMPT,
                                                      tokens=args.tokens, repeats=args.repeats)[1]
        row["prompt128_ms"] = 1000 * decoder.decode_speed(sess, layout, prompt=LONG_PROMPT, tokens=1,
                                                          repeats=args.repeats)[0]
        rows.append(row)
        print(f"  measured {v.name}", flush=True)
    return rows


def table(rows: list[dict]) -> None:
    eager = rows[0]
    print(f"\n{'variant':<16}{'passed':>7}{'MB':>8}{'cosine':>9}{'top1':>6}"
          + "".join(f"{f'tok/s b{b}':>12}{'x eager':>8}" for b in BATCHES) + f"{'prompt128 ms':>14}")
    for r in rows:
        if "tok_s_b1" not in r:
            print(f"{r['name']:<16}{'no':>7}  not built: {r.get('error')}")
            continue
        cells = "".join(f"{r[f'tok_s_b{b}']:>12.1f}{r[f'tok_s_b{b}'] / eager[f'tok_s_b{b}']:>8.2f}" for b in BATCHES)
        passed = "-" if r["passed"] is None else ("yes" if r["passed"] else "no")
        mb = f"{r['size_mb']:.0f}" if r["size_mb"] else "-"
        cos = f"{r['cosine']:.4f}" if r.get("cosine") is not None else "-"
        top1 = f"{r['top1']:.2f}" if r.get("top1") is not None else "-"
        print(f"{r['name']:<16}{passed:>7}{mb:>8}{cos:>9}{top1:>6}{cells}{r['prompt128_ms']:>14.1f}")


def verdict(rows: list[dict], made) -> dict:
    eager = rows[0]["tok_s_b1"]
    by_name = {r["name"]: r for r in rows if "tok_s_b1" in r}
    passing = [r for r in by_name.values() if r["passed"]]
    best = max(passing, key=lambda r: r["tok_s_b1"], default=None)
    out = {"best": best and best["name"], "best_vs_eager": best and best["tok_s_b1"] / eager,
           "export_vs_eager": by_name["export"]["tok_s_b1"] / eager if "export" in by_name else None}
    for key, target in TARGETS.items():
        got = out[f"{key}_vs_eager"]
        print(f"{key} vs eager at batch 1: {got:.2f}x (target {target}x): "
              f"{'met' if got is not None and got >= target else 'NOT met'}" if got else f"{key}: not measured")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small model (hidden 256, 4 layers, vocab 8000)")
    ap.add_argument("--threads", type=int, default=2, help="threads for PyTorch and onnxruntime alike")
    ap.add_argument("--tokens", type=int, default=32, help="new tokens per decode measurement")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--out", type=Path, default=None, help="where the files go (default: a temporary folder)")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    ap.add_argument("--smoke", action="store_true", help="a tiny model (hidden 32, 1 layer, vocab 128), 4 tokens, "
                    "1 repeat: runs every step once, quickly")
    args = ap.parse_args()
    if args.smoke:
        args.tokens, args.repeats, args.max_length = 4, 1, LONG_PROMPT + 8
    torch.set_num_threads(args.threads)
    model, params = build(SMOKE if args.smoke else QUICK if args.quick else FULL)
    print(f"model: {params / 1e6:.1f}M parameters, {args.threads} threads", flush=True)
    with tempfile.TemporaryDirectory(prefix="onnxport-decoder-bench-") as tmp:
        out = args.out or Path(tmp)
        t0 = time.perf_counter()
        outcome = decoder.run_model(model, out, max_length=args.max_length, progress=print)
        print(f"exported and proven in {time.perf_counter() - t0:.0f} s: passed={outcome.passed}", flush=True)
        t0 = time.perf_counter()
        made = decoder.optimize_decoder(model, outcome.layout, outcome.path, out, progress=print,
                                        settings=decoder.CacheVariants(threads=args.threads))
        print(f"variants made and proven in {time.perf_counter() - t0:.0f} s", flush=True)
        for v in made.variants:
            print(f"  {v.name}: passed={v.passed} {v.error or ''} {'; '.join(v.notes)}")
        rows = measure(args, model, outcome.layout, made)
    table(rows)
    summary = verdict(rows, made)
    if args.json:
        write_results(args.json, "decoder.py", sys.argv[1:],
                      json.loads(json.dumps({"params": params, "threads": args.threads, "rows": rows,
                                             "variants": made.to_dict(), **summary}, default=str)))


if __name__ == "__main__":
    main()
