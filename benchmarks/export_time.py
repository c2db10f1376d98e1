"""End-to-end `onnxport export` wall time (process start to exit), with the stage breakdown from report.json.

    .venv/bin/python benchmarks/export_time.py            # resnet18, 3 runs
    .venv/bin/python benchmarks/export_time.py --runs 1 --source hf:DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", default="torchvision:resnet18")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("extra", nargs="*", help="more onnxport export options")
    args = ap.parse_args()
    walls = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out"
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "onnxport", "export", args.source, "-o", str(out),
                                   *args.extra], capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if proc.returncode != 0:
                sys.exit(f"run {i}: exit {proc.returncode}\n{proc.stderr}")
            rep = json.loads((out / "report.json").read_text())
            walls.append(wall)
            stages = " ".join(f"{k} {v:.1f}s" for k, v in rep["timings"].items())
            print(f"run {i + 1}: {wall:.1f} s wall  ({stages}; exporter {rep['export']['exporter']}, "
                  f"{len(rep['validation']['cases'])} cases)")
    print(f"{args.source}: median {statistics.median(walls):.1f} s, min {min(walls):.1f} s over {len(walls)} runs")


if __name__ == "__main__":
    main()
