"""Decode speed of an exported encoder-decoder (its three files, greedy loop) against PyTorch ``generate()``.

    python benchmarks/seq2seq.py            # ~60M-parameter T5-small shape, random weights
    python benchmarks/seq2seq.py --quick    # a small model
    python benchmarks/seq2seq.py --smoke    # a tiny model, 1 repeat: every code path once, in seconds
    python benchmarks/seq2seq.py --variants # the fused and int8 variants too, as convert judges and times them

The model (d_model 512, d_ff 2048, 6 + 6 layers, 8 heads of 64, vocab 32128: T5-small's shape) is built from a
T5Config with random weights, exported with its cache and proven (``seq2seq.run_model``). Measured with the
same thread count for PyTorch and onnxruntime, at batch 1 and 8 on sources of 32 tokens: decode tokens/s over
all rows (the time of 33 tokens minus the time of 1, so the encoder and the first step are left out), and the
time to the first token (encoder + first step).
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

from onnxport import seq2seq
from onnxport.bench import best_of
from onnxport.core.greedy import PLAIN
from onnxport.decoder.records import CacheVariants
from onnxport.seq2seq.prove import reference_generate

FULL = dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8)
QUICK = dict(vocab_size=4000, d_model=128, d_kv=32, d_ff=512, num_layers=2, num_decoder_layers=2, num_heads=4)
SMOKE = dict(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=4)
BATCHES = (1, 8)
SOURCE = 32
TOKENS = 32


def build(config: dict):
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    model = T5ForConditionalGeneration(T5Config(decoder_start_token_id=0, **config)).eval()
    return model, sum(p.numel() for p in model.parameters())


def speeds(run, repeats: int, batch: int) -> dict:
    """``run(n)`` generates n tokens per row: first-token ms and decode tokens/s over all rows (the time of
    TOKENS + 1 tokens minus the time of 1)."""
    first = best_of(lambda: run(1), repeats)
    full = best_of(lambda: run(TOKENS + 1), repeats)
    return {"first_token_ms": round(first * 1000, 1),
            "decode_tok_s": round(batch * TOKENS / max(full - first, 1e-9), 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", action="store_true", help="build, judge and time fused and int8 too")
    parser.add_argument("--smoke", action="store_true", help="a tiny model (d_model 32, 1 + 1 layers), 1 repeat")
    parser.add_argument("--json", type=Path, help="also write the figures to this results file")
    args = parser.parse_args(argv)
    if args.smoke:
        args.repeats = 1
    torch.set_num_threads(args.threads)
    model, params = build(SMOKE if args.smoke else QUICK if args.quick else FULL)
    rows: dict = {"parameters": params, "threads": args.threads, "source": SOURCE, "tokens": TOKENS}
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        made = seq2seq.run_model(model, out, max_length=TOKENS + 8, max_source=128,
                                 variants=CacheVariants("all" if args.variants else None, threads=args.threads))
        rows["export_and_proof_s"] = round(time.perf_counter() - t0, 1)
        rows["proven"] = made.passed
        if made.variants is not None:  # decode tokens/s at batch 1 on a 16-token source, as convert times them
            rows["variants"] = {v.name: {"decode_tok_s": round(v.decode_tok_s or 0, 1), "passed": v.passed,
                                         "cosine": v.cosine and round(v.cosine, 4), "error": v.error}
                                for v in made.variants.variants}
            rows["best"] = made.variants.best.name if made.variants.best else None
        layout = made.layout
        sessions = seq2seq.open_sessions(out, made.passed, threads=args.threads)
        for batch in BATCHES:
            ids = np.random.default_rng(batch).integers(2, layout.vocab, (batch, SOURCE), dtype=np.int64)
            feeds = [ids, np.ones_like(ids)]
            torch_in = [torch.from_numpy(ids), torch.ones(batch, SOURCE, dtype=torch.long)]
            rows[f"batch {batch}"] = {
                "pytorch generate()": speeds(lambda n, t=torch_in: reference_generate(model, layout, t, n), args.repeats,
                                             batch),
                "onnx loop": speeds(lambda n, f=feeds: seq2seq.generate_greedy(sessions, layout, f, n, PLAIN),
                                    args.repeats, batch),  # no end-of-sequence stop, as the reference
            }
            eager = rows[f"batch {batch}"]["pytorch generate()"]["decode_tok_s"]
            onnx = rows[f"batch {batch}"]["onnx loop"]["decode_tok_s"]
            rows[f"batch {batch}"]["x generate"] = round(onnx / eager, 2)
    print(json.dumps(rows, indent=2))
    if args.json:
        write_results(args.json, "seq2seq.py", sys.argv[1:] if argv is None else argv, rows)


if __name__ == "__main__":
    main()
