"""A real model over 2 GiB through the pipeline: convert (export with external data, check, parity, variants),
check by path, Triton repository. Each stage runs as its own ``onnxport`` process so its peak RSS and wall
time are measured alone.

    python benchmarks/large_model.py --out /tmp/big            # 9 x Linear(8192, 8192): 2.25 GiB of fp32
    python benchmarks/large_model.py --layers 2 --width 1024   # a quick smoke run

By default export (+ check + parity) and each variant run as separate processes; ``--together`` runs one
``convert --variants`` instead. The model is a stack of big Linear layers with random weights (``BigMLP`` below), built in the onnxport
process from this file. Needs about 3x the model size in free disk per variant and ~4x in memory at the peak.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn


class BigMLP(nn.Module):
    """``layers`` Linear(width, width) + ReLU, then a 10-way head."""

    def __init__(self, width: int = 8192, layers: int = 9) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())])
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        return self.head(self.body(x))


def run_stage(name: str, args: list[str]) -> dict:
    """Run ``python -m onnxport ARGS``; its wall time, peak RSS and exit code."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "onnxport", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.returncode = os.waitstatus_to_exitcode(status)
    row = {"stage": name, "seconds": round(time.perf_counter() - t0, 1),
           "peak_rss_gib": round(usage.ru_maxrss / 1024**2, 2), "exit": proc.returncode}
    print(f"{name:<10} {row['seconds']:>7.1f} s  peak RSS {row['peak_rss_gib']:>5.2f} GiB  exit {proc.returncode}",
          flush=True)
    if proc.returncode not in (0, 1):
        print(err[-3000:], file=sys.stderr)
    row["stdout"] = out
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("large-model-out"))
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=9)
    ap.add_argument("--exporter", default="dynamo")
    ap.add_argument("--variants", default="slim,ort,fp16")
    ap.add_argument("--together", action="store_true", help="one convert process instead of one per stage")
    args = ap.parse_args()
    params = args.layers * (args.width * args.width + args.width) + args.width * 10 + 10
    print(f"BigMLP width {args.width} x {args.layers} layers: {params:,} parameters, {params * 4 / 1024**3:.2f} GiB "
          "fp32", flush=True)
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    source = f"{Path(__file__).resolve()}:BigMLP"
    model_args = json.dumps({"width": args.width, "layers": args.layers})
    spec = ["--model-args", model_args, "-i", f"x:float32[batch,{args.width}]", "-d", "batch=1..4"]
    if args.together:  # one process: the peak is that of the whole pipeline
        rows = [run_stage("convert", ["convert", source, *spec, "--exporter", args.exporter, "--variants",
                                      args.variants, "--no-bench", "-o", str(args.out / "out"), "--json"])]
    else:  # export + check + parity, then each variant in its own process
        rows = [run_stage("export", ["export", source, *spec, "--exporter", args.exporter, "-o",
                                     str(args.out / "out"), "--json"])]
        for name in filter(None, args.variants.split(",")):
            rows.append(run_stage(f"opt:{name}", ["optimize", source, str(args.out / "out" / "model.onnx"), *spec,
                                                  "--variants", name, "-o", str(args.out / f"opt-{name}"), "--json"]))
    rep = json.loads(rows[0]["stdout"]) if rows[0]["stdout"].strip() else {}
    for r in rows[1:]:
        if r["stdout"].strip():
            rep.setdefault("variants", []).extend(v for v in json.loads(r["stdout"]).get("variants", [])
                                                  if v["name"] != "export")
    rows.append(run_stage("check", ["check", str(args.out / "out" / "model.onnx"), "--json"]))
    rows.append(run_stage("triton", ["triton", str(args.out / "out"), "--repo", str(args.out / "repo")]))
    files = {str(p.relative_to(args.out)): round(p.stat().st_size / 1024**3, 3)
             for p in sorted(args.out.rglob("*.onnx*")) if p.is_file()}
    summary = {
        "parameters": params, "fp32_gib": round(params * 4 / 1024**3, 3),
        "status": rep.get("status"), "external_data": rep.get("export", {}).get("external_data"),
        "exporter": rep.get("export", {}).get("exporter"), "timings_s": rep.get("timings"),
        "max_abs_err": max((c["max_abs_err"] or 0 for c in (rep.get("validation") or {}).get("cases", [])), default=None),
        "variants": [(v["name"], v["passed"], v.get("max_abs_err"), v.get("latency_ms")) for v in rep.get("variants", [])],
        "stages": [{k: v for k, v in r.items() if k != "stdout"} for r in rows], "files_gib": files,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
