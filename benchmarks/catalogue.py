"""Every model a library ships, by name through the CLI with random weights and nothing downloaded:
``onnxport export torchvision:NAME`` (every model of ``torchvision.models.list_models()``), ``timm:NAME`` (one
model per timm architecture module, its smallest variant), a third-party library's model handed over as a Python
factory (``_thirdparty_models.py``: ultralytics YOLO, segmentation_models_pytorch) or a tiny Hugging Face folder of
a type beyond the test matrix (``_hf_models.py``), with no ``--input``, one at a time under a CPU-second and a
memory limit. Writes, per model, proven or the one-line reason, the exporter that won, the seconds and the
parameters, rewriting the results file after each model (a sweep cut short leaves an honest partial file);
models over ``--max-params`` (too large for a sweep on 2 cores) are listed as such, not exported.

    .venv/bin/python benchmarks/catalogue.py                         # every torchvision model
    .venv/bin/python benchmarks/catalogue.py --library timm --timeout 180
    .venv/bin/python benchmarks/catalogue.py --only r3d_18 --only maxvit_t --timeout 300
    .venv/bin/python benchmarks/catalogue.py --library thirdparty    # needs ultralytics, segmentation-models-pytorch
    .venv/bin/python benchmarks/catalogue.py --library hf            # Hugging Face types beyond the test matrix
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUTCOMES = {0: "proven", 1: "not proven", 2: "refused", 3: "export failed", 4: "environment"}


def torchvision_names() -> list[str]:
    import torchvision

    return torchvision.models.list_models()


def torchvision_parameters(name: str) -> int | None:
    """The parameter count torchvision's weights record for ``name`` (nothing downloaded), None if unknown."""
    import torchvision

    try:
        weights = next(iter(torchvision.models.get_model_weights(name)))
        return int(weights.meta["num_params"])
    except (ValueError, StopIteration, KeyError, TypeError):
        return None


def meta_parameters(name: str) -> int | None:
    """The parameter count of timm's ``name`` built on the meta device (no memory, no weights), None if it
    cannot be built there."""
    import timm
    import torch

    try:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False)
    except Exception:  # noqa: BLE001 - a model that will not build on meta: count unknown
        return None
    return sum(p.numel() for p in model.parameters())


SIZE_WORDS = ("test", "atto", "femto", "pico", "nano", "tiny", "xxs", "xs", "mini", "small", "lite", "s")


def _size_rank(name: str) -> tuple[int, int, str]:
    """Smaller first: the earliest size word of SIZE_WORDS among the name's parts, then the shorter name."""
    parts = name.replace("-", "_").split("_")
    ranks = [SIZE_WORDS.index(w) for p in parts for w in SIZE_WORDS if p == w or p.startswith(w) and w != "s"]
    return (min(ranks, default=len(SIZE_WORDS)), len(name), name)


def timm_names() -> list[str]:
    """One model per timm architecture module: the smallest by name (size words, then the shortest name;
    counting every variant's parameters, even on the meta device, costs minutes of a shared machine), never
    one of timm's own ``test_*`` miniatures where the module has a real variant."""
    import timm

    picked = []
    for module in sorted(timm.list_modules()):
        names = timm.list_models(module=module)
        real = [n for n in names if not n.startswith("test_")]
        if names:
            picked.append(min(real or names, key=_size_rank))
    return picked


def _module(name: str):
    """A model list beside this script (``_thirdparty_models``, ``_hf_models``): its ``MODELS`` name -> factory."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    return importlib.import_module(name)


def _names(module: str) -> list[str]:
    return list(_module(module).MODELS)


def _built_parameters(module: str, name: str) -> int | None:
    """The parameter count of ``name`` built from its factory (None if its library is missing or the build fails:
    the export, or the folder's save, tries again and keeps the error)."""
    try:
        return sum(p.numel() for p in _module(module).MODELS[name]().parameters())
    except Exception:  # noqa: BLE001 - said by the export
        return None


LIBRARIES = {"torchvision": (torchvision_names, torchvision_parameters),
             "timm": (timm_names, meta_parameters),
             "thirdparty": (partial(_names, "_thirdparty_models"), partial(_built_parameters, "_thirdparty_models")),
             "hf": (partial(_names, "_hf_models"), partial(_built_parameters, "_hf_models"))}


def source(library: str, name: str, work: Path | None = None) -> str:
    """What ``onnxport export`` is given: LIBRARY:NAME, the third-party factory in _thirdparty_models.py, or the
    tiny Hugging Face folder of _hf_models.py saved under ``work``."""
    if library == "thirdparty":
        return f"{HERE / '_thirdparty_models.py'}:{name}"
    if library == "hf":
        return f"hf:{_module('_hf_models').save(name, (work or Path(tempfile.mkdtemp())) / f'hf-{name}')}"
    return f"{library}:{name}"


def _run(cmd: list[str], timeout: float, max_rss: int) -> tuple[int | None, str, str, float]:
    """Run ``cmd`` in its own process group, killed past ``timeout`` CPU seconds (the machine is shared: wall
    time says more about the neighbours than the model; four times as many wall seconds stop a hang) or
    ``max_rss`` bytes resident (the whole tree): (exit code or None, stdout+stderr, why it was killed or "",
    CPU seconds)."""
    import resource

    import psutil

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        end, why, cpu = time.monotonic() + 4 * timeout, "", 0.0
        while proc.poll() is None:
            try:
                tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
                rss = sum(p.memory_info().rss for p in tree)
                cpu = max(cpu, sum(sum(p.cpu_times()[:4]) for p in tree))
            except psutil.Error:
                rss = 0
            if rss > max_rss:
                why = f"over {max_rss / 2**30:.0f} GiB resident"
            elif cpu > timeout or time.monotonic() > end:
                why = f"timeout ({timeout:.0f} CPU seconds)" if cpu > timeout else f"timeout ({4 * timeout:.0f} s)"
            if why:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            time.sleep(0.5)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = max(cpu, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        log.seek(0)
        return (None if why else proc.returncode), log.read(), why, cpu


def one(library: str, name: str, work: Path, timeout: float, max_params: int, max_rss: int) -> dict:
    count = LIBRARIES[library][1](name)
    row: dict = {"name": name, "parameters": count}
    if count is not None and count > max_params:
        return {**row, "outcome": "too large", "line": f"{count:,} parameters, over {max_params:,} for a sweep"}
    out = work / f"out-{name}"
    try:
        src = source(library, name, work)
    except Exception as e:  # noqa: BLE001 - a tiny config its class cannot be built from: this sweep's, said so
        return {**row, "outcome": "not built", "line": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    cmd = [sys.executable, "-m", "onnxport", "export", src, "-o", str(out), "--force"]
    t = time.perf_counter()
    code, said, why, cpu = _run(cmd, timeout, max_rss)
    row.update(seconds=round(time.perf_counter() - t, 1), cpu_seconds=round(cpu, 1))
    if code is None:
        return {**row, "outcome": "timeout" if why.startswith("timeout") else "out of memory", "line": why}
    row.update(outcome=OUTCOMES.get(code, "crashed"), exit=code)
    try:
        report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        report = {}
    row["exporter"] = (report.get("export") or {}).get("exporter")
    if report.get("timings"):
        row["timings"] = {k: round(v, 1) for k, v in report["timings"].items()}
    warned = [d["code"] for d in report.get("diagnostics") or [] if d.get("severity") == "warning"]
    if warned:
        row["warnings"] = warned
    if code:
        lines = [ln.strip() for ln in said.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith(("error", "Error"))] or lines
        row["line"] = (errors[0] if errors else "")[:400]
    shutil.rmtree(out, ignore_errors=True)
    if src.startswith("hf:"):
        shutil.rmtree(src[3:], ignore_errors=True)
    return row


REFUSED = ("refused", "not proven", "export failed", "crashed")


def check_refusal(library: str, name: str, timeout: float, max_rss: int) -> dict:
    """benchmarks/refusal_check.py on one refused model, under the same limits: its verdict and attempts."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "check.json"
        code, said, why, cpu = _run([sys.executable, str(HERE / "refusal_check.py"), source(library, name, Path(tmp)),
                                     "--json", str(out)], timeout, max_rss)
        if code == 0 and out.is_file():
            found = json.loads(out.read_text(encoding="utf-8"))
            return {"verdict": found["verdict"], "attempts": found["attempts"], "cpu_seconds": round(cpu, 1)}
        lines = [ln for ln in said.splitlines() if ln.strip()]
        return {"verdict": f"not checked: {why or (lines[-1][:300] if lines else f'exit {code}')}"}


def write(args: argparse.Namespace, rows: list[dict], total: int, checked: dict | None = None) -> dict[str, int]:
    import torch

    counts: dict[str, int] = {}
    for r in rows:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    versions = {"torch": torch.__version__}
    for lib in ("torchvision", "timm"):
        with contextlib.suppress(ImportError):
            versions[lib] = __import__(lib).__version__
    previous = json.loads(args.out.read_text(encoding="utf-8")) if args.resume and args.out.is_file() else {}
    command = " ".join([Path(sys.executable).name, *sys.argv])
    if previous.get("command"):  # a resumed sweep: every run that made the file (written again after each row)
        done = previous["command"]
        command = done if done.endswith(command) else f"{done}; then {command}"
    result = {"command": command, "created_at": time.strftime("%Y-%m-%d"),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores", **versions,
              "timeout_s": args.timeout, "swept": f"{len(rows)} of {total}", "summary": counts,
              **{k: previous[k] for k in ("refusals_checked", "notes") if k in previous}, "models": rows}
    if checked:
        result["refusals_checked"] = {**result.get("refusals_checked", {}), **checked}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return counts


def summary(paths: list[Path], over: float = 60.0) -> str:
    """Markdown for the docs: per results file its counts, then every model not proven with its line, and the
    proven ones over ``over`` CPU seconds."""
    order = ("proven", "refused", "not proven", "export failed", "crashed", "timeout", "out of memory",
             "too large", "not built")
    lines = ["| sweep | models | " + " | ".join(order) + " |", "|---|---:|" + "---:|" * len(order)]
    rest, slow = [], []
    for path in paths:
        found = json.loads(path.read_text(encoding="utf-8"))
        rows, label = found["models"], path.stem.removeprefix("catalogue_")
        counts = {k: sum(r["outcome"] == k for r in rows) for k in order}
        lines.append(f"| {label} | {found['swept']} | " + " | ".join(str(counts[k] or "") for k in order) + " |")
        checked = found.get("refusals_checked", {})
        for r in rows:
            if r["outcome"] != "proven":
                why = r.get("line", "").replace("|", "\\|")
                check = checked.get(r["name"], {})
                verdict = check.get("verdict", "") if isinstance(check, dict) else str(check)[:200]
                rest.append(f"| {label} | {r['name']} | {r['outcome']} | {why[:220]} | {verdict} |")
            elif (r.get("cpu_seconds") or 0) > over:
                slow.append(f"{r['name']} ({r['cpu_seconds']:.0f})")
    out = "\n".join(lines)
    if rest:
        out += ("\n\n| sweep | model | outcome | the line | plain exporters (refusal_check.py) |\n|---|---|---|---|---|\n"
                + "\n".join(rest))
    if slow:
        out += f"\n\nProven, over {over:.0f} CPU seconds: " + ", ".join(slow) + "."
    return out


def main() -> None:
    if sys.argv[1:2] == ["--summary"]:  # catalogue.py --summary results/catalogue_*.json: markdown for the docs
        print(summary([Path(p) for p in sys.argv[2:]]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--library", choices=sorted(LIBRARIES), default="torchvision")
    ap.add_argument("--only", action="append", default=[], help="a model name (repeatable); default: every one")
    ap.add_argument("--timeout", type=float, default=600, help="CPU seconds per model (4x as many wall seconds)")
    ap.add_argument("--max-params", type=int, default=150_000_000, help="larger models are listed, not built")
    ap.add_argument("--max-gib", type=float, default=8, help="a model's export killed past this resident memory")
    ap.add_argument("--resume", action="store_true", help="keep the rows already in --out; sweep the rest")
    ap.add_argument("--stride", type=int, default=1, help="a deterministic subset: every STRIDE-th model")
    ap.add_argument("--reverse", action="store_true", help="from the last model back (a second sweep meeting the "
                                                           "first halfway; merge the files with --resume)")
    ap.add_argument("--out", type=Path, help="default: results/catalogue_LIBRARY.json")
    ap.add_argument("--check-refusals", action="store_true",
                    help="then try the plain exporters on each model not proven (refusal_check.py) and record it")
    args = ap.parse_args()
    args.out = args.out or HERE / "results" / f"catalogue_{args.library}.json"
    known = LIBRARIES[args.library][0]()
    todo = [n for n in known if not args.only or n in args.only] + [n for n in args.only if n not in known]
    todo = todo[::args.stride][::-1 if args.reverse else 1]
    rows = []
    if args.resume and args.out.is_file():  # keep what was swept (an --only model's row until its new one)
        rows = [r for r in json.loads(args.out.read_text(encoding="utf-8"))["models"]
                if r["name"] in known or r["name"] in todo]  # no longer picked: gone
    done = {r["name"] for r in rows} - set(args.only)
    work = Path(tempfile.mkdtemp(prefix="catalogue-"))
    try:
        for name in [n for n in todo if n not in done]:
            row = one(args.library, name, work, args.timeout, args.max_params, int(args.max_gib * 2**30))
            rows = [r for r in rows if r["name"] != name] + [row]
            print(json.dumps(row), flush=True)
            write(args, rows, len(known))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    checked: dict = {}
    if args.check_refusals:
        for row in [r for r in rows if r["outcome"] in REFUSED and (not args.only or r["name"] in args.only)]:
            checked[row["name"]] = check_refusal(args.library, row["name"], args.timeout, int(args.max_gib * 2**30))
            print(json.dumps({row["name"]: checked[row["name"]]["verdict"]}), flush=True)
            write(args, rows, len(known), checked)
    print(json.dumps(write(args, rows, len(known), checked)))


if __name__ == "__main__":
    main()
