"""Every model torchvision ships, by name through the CLI with random weights and nothing downloaded:
``onnxport export torchvision:NAME`` with no ``--input``, each under a time limit. Writes, per model, proven or
the one-line reason, the exporter that won and the seconds; models over ``--max-params`` (too large for a
sweep on 2 cores) are listed as such, not built.

    .venv/bin/python benchmarks/catalogue.py                         # every model; writes the results file
    .venv/bin/python benchmarks/catalogue.py --only r3d_18 --only maxvit_t --timeout 300
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "catalogue.json"
OUTCOMES = {0: "proven", 1: "not proven", 2: "refused", 3: "export failed", 4: "environment"}


def names(only: list[str]) -> list[str]:
    import torchvision

    known = torchvision.models.list_models()
    return [n for n in known if not only or n in only] + [n for n in only if n not in known]


def parameters(name: str) -> int | None:
    """The parameter count torchvision's weights record for ``name`` (nothing downloaded), None if unknown."""
    import torchvision

    try:
        weights = next(iter(torchvision.models.get_model_weights(name)))
        return int(weights.meta["num_params"])
    except (ValueError, StopIteration, KeyError, TypeError):
        return None


def one(name: str, work: Path, timeout: float, max_params: int) -> dict:
    count = parameters(name)
    row: dict = {"name": name, "parameters": count}
    if count is not None and count > max_params:
        return {**row, "outcome": "too large", "line": f"{count:,} parameters, over {max_params:,} for a sweep"}
    out = work / f"out-{name}"
    cmd = [sys.executable, "-m", "onnxport", "export", f"torchvision:{name}", "-o", str(out), "--force"]
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**row, "outcome": "timeout", "seconds": timeout}
    row.update(outcome=OUTCOMES.get(proc.returncode, "crashed"), exit=proc.returncode,
               seconds=round(time.perf_counter() - t, 1))
    try:
        report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        report = {}
    row["exporter"] = (report.get("export") or {}).get("exporter")
    warned = [d["code"] for d in report.get("diagnostics") or [] if d.get("severity") == "warning"]
    if warned:
        row["warnings"] = warned
    if proc.returncode:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        said = [ln for ln in lines if ln.startswith(("error", "Error"))] or lines
        row["line"] = (said[0] if said else "")[:400]
    shutil.rmtree(out, ignore_errors=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], help="a model name (repeatable); default: every one")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per model")
    ap.add_argument("--max-params", type=int, default=150_000_000, help="larger models are listed, not built")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    import torch
    import torchvision

    work = Path(tempfile.mkdtemp(prefix="catalogue-"))
    rows = []
    try:
        for name in names(args.only):
            rows.append(one(name, work, args.timeout, args.max_params))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    result = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "created_at": time.strftime("%Y-%m-%d"),
              "machine": f"{platform.machine()}, {platform.processor() or ''}".strip(", "),
              "torch": torch.__version__, "torchvision": torchvision.__version__, "timeout_s": args.timeout,
              "summary": counts, "models": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
