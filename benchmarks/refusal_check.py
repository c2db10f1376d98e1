"""Is a refusal right? For a model onnxport did not prove, try the plain exporters the way a user would,
without onnxport's chain: ``torch.onnx.export`` with dynamo and with TorchScript, each with the dims onnxport
declares dynamic and at the fixed export size, and run each file that comes out on onnxruntime at the sizes of
onnxport's case matrix (export, min, max, odd, ...), judged against PyTorch by onnxport's own judge at its
tolerance (each output at its own scale, detections matched as sets). A refusal is right only where no file
computes the same thing at the declared sizes.

    .venv/bin/python benchmarks/refusal_check.py torchvision:raft_small
    .venv/bin/python benchmarks/refusal_check.py timm:NAME --json out.json

Prints one JSON object: per attempt, no file (the exporter's error) or the cases the file got right and wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def _attempts(loaded, dynamic: bool):
    """(name, export function) for both plain exporters, dims dynamic or fixed at the export size."""
    import torch

    from onnxport.core.samples import export_sizes, make_inputs

    example = make_inputs(loaded.inputs, export_sizes(loaded.dims), seed=0)
    names = [s.name for s in loaded.inputs]
    outs = list(loaded.output_names)
    syms = {sym: torch.export.Dim.AUTO for sym in loaded.dims} if dynamic else {}

    def dynamo(path: Path) -> None:
        shapes = [{ax: syms[d] for ax, d in enumerate(s.shape) if isinstance(d, str) and d in syms} or None
                  for s in loaded.inputs] if dynamic else None
        torch.onnx.export(loaded.flat, example, str(path), dynamo=True, input_names=names, output_names=outs,
                          dynamic_shapes=tuple(shapes) if shapes else None, verbose=False)

    def script(path: Path) -> None:
        axes = {s.name: {ax: d for ax, d in enumerate(s.shape) if isinstance(d, str)} for s in loaded.inputs}
        torch.onnx.export(loaded.flat, example, str(path), dynamo=False, input_names=names, output_names=outs,
                          dynamic_axes=axes if dynamic else None, opset_version=20)

    kind = "dynamic" if dynamic else "fixed"
    return [(f"dynamo, {kind}", dynamo), (f"torchscript, {kind}", script)]


def _judge(loaded, path: Path, dynamic: bool) -> dict:
    """Run the file at each case of onnxport's matrix (those at the export size when it is fixed) through onnxport's
    own judge (each output at its own scale, detections matched as sets): cases right and wrong, and the first
    wrong one's error."""
    from onnxport.core.samples import validation_cases
    from onnxport.prove.parity import compare

    cases = validation_cases(loaded.dims)
    if not dynamic:  # a fixed file: the cases at the export size (its values: random, edge)
        cases = [c for c in cases if dict(c.sizes) == dict(cases[0].sizes)]
    result = compare(loaded, path, cases=cases)
    if result.load_error:
        return {"error": f"onnxruntime: {result.load_error[:240]}"}
    wrong = [c for c in result.cases if not c.passed]
    first = wrong and f"{wrong[0].label}: {wrong[0].error or f'max abs error {wrong[0].max_abs_err:.3g}'}"[:300]
    return {"right": [c.label for c in result.cases if c.passed], "wrong": [c.label for c in wrong],
            **({"first_wrong": first} if first else {}),
            **({"cannot_tell": dict(result.cannot_tell)} if result.cannot_tell else {})}


def _reason(e: BaseException) -> str:
    """The root cause's first line (torch.onnx wraps it in 'Failed to export ... step 1/3'), without colours."""
    import re

    while e.__cause__ is not None:
        e = e.__cause__
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return f"{type(e).__name__}: {line[:240]}"


def _telling(loaded) -> bool:
    """Whether PyTorch's outputs depend on the inputs at all: two random inputs of the export size give some output
    that is not empty and differs. With random weights a detector may detect nothing and a zero-initialised head
    give zeros for every input; then every file matches PyTorch, and neither a proof nor this check can tell."""
    import torch

    from onnxport.core.samples import export_sizes, make_inputs

    outs = []
    for seed in (1, 2):
        with torch.inference_mode():
            out = loaded.flat(*make_inputs(loaded.inputs, export_sizes(loaded.dims), seed=seed))
        outs.append([o.detach() for o in (out if isinstance(out, (tuple, list)) else (out,))])
    return any(a.numel() and (a.shape != b.shape or not torch.equal(a, b)) for a, b in zip(*outs))


def _unsteady(loaded) -> str | None:
    """The output PyTorch's own answer moves past onnxport's tolerance for, when the inputs at the export size
    are nudged as onnxport's judge nudges them (1e-6 of their magnitude: float32 rounding's size), with how far;
    None when every output holds. RT-DETR's random weights tie the scores its top-k picks the queries by, so
    rounding alone picks others: no file can be judged against such outputs, right or wrong."""
    import numpy as np

    from onnxport.core.records import FP32
    from onnxport.core.samples import export_sizes, make_inputs
    from onnxport.prove.compare import compare_arrays, own_tolerance
    from onnxport.prove.conditioning import nudged
    from onnxport.prove.references import torch_outputs

    x = tuple(make_inputs(loaded.inputs, export_sizes(loaded.dims), seed=0))
    for name, p, q in zip(loaded.output_names, torch_outputs(loaded, x), torch_outputs(loaded, nudged(x, 0))):
        if (loaded.compare or {}).get(name) == "detections":
            continue  # matched as sets, not element by element
        if p.dtype.kind == "f" and p.shape == q.shape and p.size:
            _, _, ok = compare_arrays(p, q, own_tolerance(p, FP32))
            if not ok:
                return f"'{name}' by {float(np.abs(p - q).max()):.3g}"
    return None


def check(source: str, inputs: list[str] | None = None, dims: list[str] | None = None) -> dict:
    """Every plain attempt for ``source`` (loaded as onnxport loads it, with ``inputs``/``dims`` as -i/-d):
    {attempt: {"error"} or {"right", "wrong", ...}}, and a verdict."""
    from onnxport.api import load_model

    loaded = load_model(source, inputs=inputs, dims=dims)
    result: dict = {"source": source, "dims": {k: str(d) for k, d in loaded.dims.items()}, "attempts": {}}
    if not _telling(loaded):
        result["verdict"] = ("cannot tell: with these weights PyTorch's outputs are the same (or empty) for every "
                             "input, so every file matches them and no export can be proven or refused by them")
        return result
    moved = _unsteady(loaded)
    if moved:
        result["verdict"] = (f"cannot tell: PyTorch's own outputs move past the tolerance when the inputs are "
                             f"nudged by 1e-6 of their magnitude ({moved}), so no file can be judged against them")
        return result
    with tempfile.TemporaryDirectory() as tmp:
        for dynamic in (True, False):
            for name, export in _attempts(loaded, dynamic):
                path = Path(tmp) / f"{name.replace(', ', '_')}.onnx"
                t = time.perf_counter()
                try:
                    export(path)
                except Exception as e:  # noqa: BLE001 - the exporter's refusal is the answer
                    result["attempts"][name] = {"error": _reason(e),
                                                "seconds": round(time.perf_counter() - t, 1)}
                    continue
                try:
                    judged = _judge(loaded, path, dynamic)
                except Exception as e:  # noqa: BLE001 - a file onnxruntime cannot load
                    judged = {"error": f"onnxruntime: {str(e).splitlines()[0][:240]}"}
                result["attempts"][name] = {**judged, "seconds": round(time.perf_counter() - t, 1)}
    full = [n for n, a in result["attempts"].items() if a.get("right") and not a.get("wrong")
            and n.endswith("dynamic")]
    result["verdict"] = (f"refusal wrong: {', '.join(full)} made a file right at every case" if full else
                         "refusal right: no plain exporter made a file right at every declared size")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source")
    ap.add_argument("-i", "--input", action="append", default=[], help="as onnxport's -i")
    ap.add_argument("-d", "--dim", action="append", default=[], help="as onnxport's -d")
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args()
    result = check(args.source, args.input, args.dim)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    sys.exit(0)


if __name__ == "__main__":
    main()
