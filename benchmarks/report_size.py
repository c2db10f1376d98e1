"""Size and render time of report.html for a large synthetic report (5,000 nodes, 100 validation cases).

    .venv/bin/python benchmarks/report_size.py                     # 5,000 nodes, 100 cases, 5 renders
    .venv/bin/python benchmarks/report_size.py --nodes 20000 --cases 400 --out /tmp/big.html
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

ONNX_OPS = (
    "Conv", "Relu", "Add", "MatMul", "Gemm", "Mul", "Sub", "Div", "Reshape", "Transpose", "Concat",
    "Slice", "Gather", "Unsqueeze", "Squeeze", "Shape", "Cast", "Softmax", "LayerNormalization", "Sigmoid",
    "Tanh", "Erf", "Sqrt", "Pow", "ReduceMean", "ReduceSum", "MaxPool", "AveragePool", "GlobalAveragePool",
    "BatchNormalization", "Expand", "Where", "Equal", "Less", "Greater", "Not", "And", "Or", "Range",
    "ConstantOfShape", "Split", "Pad", "Resize", "Flatten", "Identity", "Neg", "Exp", "Log", "Abs", "Clip",
    "Max", "Min", "TopK", "ArgMax", "Einsum", "LSTM", "GRU", "ScatterND", "GatherND", "NonZero", "Tile",
    "Trilu", "CumSum", "DequantizeLinear", "QuantizeLinear",
)


def synthetic_report(nodes: int = 5000, cases: int = 100, seed: int = 0) -> dict:
    """A schema-valid validation_failed report with a long-tailed op histogram, ``cases`` cases (a few failing),
    variants, a benchmark and many diagnostics: the worst case for the page's readability and size."""
    rng = random.Random(seed)
    weights = [1 / (i + 1) ** 1.2 for i in range(len(ONNX_OPS))]
    histogram: dict[str, int] = {}
    for op in rng.choices(ONNX_OPS, weights, k=nodes):
        histogram[op] = histogram.get(op, 0) + 1
    case_rows = []
    for i in range(cases):
        batch, seq = rng.choice([1, 2, 7, 16, 32]), rng.choice([1, 16, 63, 128, 512])
        err = 0.0 if i % 17 == 0 else 10 ** rng.uniform(-8, -5)
        failed = i % 23 == 5
        case_rows.append({"label": f"case {i}", "sizes": {"batch": batch, "seq": seq},
                          "shapes": {"input_ids": [batch, seq], "attention_mask": [batch, seq]},
                          "max_abs_err": None if i == 51 else (0.42 if failed else err),
                          "max_rel_err": None if i == 51 else (0.9 if failed else err * 10),
                          "passed": not failed and i != 51,
                          "error": "onnxruntime: Reshape node '/attn/Reshape' bad shape" if i == 51
                          else ("logits: max abs error 0.42" if failed else None)})
    n_ok = sum(c["passed"] for c in case_rows)
    runs = [{"backend": b, "batch": bs, "p50_ms": base * bs ** 0.8, "p90_ms": base * bs ** 0.8 * 1.1,
             "p99_ms": base * bs ** 0.8 * 1.3, "throughput": 1000 * bs / (base * bs ** 0.8)}
            for b, base in (("pytorch-eager", 12.0), ("onnxruntime", 8.0), ("onnxruntime-int8", 5.0))
            for bs in (1, 2, 4, 8, 16, 32)]
    diags = [{"severity": "warning", "code": "tracer-warning", "message": f"encoder.layer.{i}: converting a tensor",
              "module": f"encoder.layer.{i}.attention", "node": None, "hint": "check parity on several shapes"}
             for i in range(30)]
    diags.insert(0, {"severity": "error", "code": "parity-failed",
                     "message": f"{cases - n_ok} of {cases} validation cases fail", "module": "encoder.layer.3",
                     "node": "/encoder/layer.3/attn/Reshape", "hint": "try --exporter dynamo"})
    return {
        "onnxport_version": "0.1.0", "status": "validation_failed",
        "summary": f"Not proven ({n_ok}/{cases} cases pass): {cases - n_ok} of {cases} validation cases fail",
        "created_at": "2026-01-01T00:00:00+00:00", "command": "onnxport convert hf:./big-model -o out",
        "model": {"source": "hf:./big-model", "name": "BigModel", "parameters": 110_000_000, "kind": "hf"},
        "export": {"exporter": "dynamo", "opset": 18, "seconds": 42.0, "path": "model.unverified.onnx",
                   "external_data": True,
                   "inputs": [{"name": "input_ids", "dtype": "int64", "shape": ["batch", "seq"]},
                              {"name": "attention_mask", "dtype": "int64", "shape": ["batch", "seq"]}],
                   "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 2]}],
                   "attempts": [{"exporter": "dynamo", "ok": True, "seconds": 42.0, "opset": 18, "error": None}]},
        "check": {"ok": True, "ir_version": 10, "opset": 18, "nodes": nodes, "initializers": 200,
                  "parameters": 110_000_000, "bytes": 440_000_000, "op_histogram": histogram,
                  "dynamic_dims": [{"input": n, "axis": a, "symbol": s, "proven": True, "symbolic": True,
                                    "min": 1, "max": 512 if s == "seq" else 32, "sizes_passed": [1, 2, 16, 32]}
                                   for n in ("input_ids", "attention_mask") for a, s in ((0, "batch"), (1, "seq"))]},
        "validation": {"passed": False, "tolerance": {"atol": 1e-4, "rtol": 1e-3}, "cases": case_rows,
                       "divergence": {"module": "encoder.layer.3", "node": "/encoder/layer.3/attn/Reshape",
                                      "max_abs_err": 0.42}},
        "variants": [{"name": n, "path": f"variants/{n}.onnx", "nodes": nodes - k * 300, "bytes": 440_000_000 // (k + 1),
                      "passed": n != "fp16", "max_abs_err": 10 ** -(6 - k), "metric": {"cosine": 0.9999 - k * 1e-4},
                      "latency_ms": 8.0 - k} for k, n in enumerate(("slim", "ort-offline", "fp16", "int8"))],
        "benchmark": {"threads": 2, "runs": runs},
        "diagnostics": diags,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, help="also write the page here")
    args = ap.parse_args()
    t0 = time.perf_counter()
    from onnxport.report import render_html, validate

    import_s = time.perf_counter() - t0
    rep = synthetic_report(args.nodes, args.cases)
    validate(rep)
    times, page = [], ""
    for _ in range(args.repeat):
        t = time.perf_counter()
        page = render_html(rep)
        times.append(time.perf_counter() - t)
    from onnxport.report.html import assets

    own = len(page.encode()) - len(assets()[1].encode())
    print(f"report.html for {args.nodes:,} nodes ({len(rep['check']['op_histogram'])} op types), {args.cases} cases")
    print(f"  size          {len(page.encode()) / 1024:,.0f} KB  (of which plotly.js {len(assets()[1].encode()) / 1024:,.0f} KB,"
          f" report itself {own / 1024:,.0f} KB)")
    print(f"  import        {import_s * 1000:,.0f} ms")
    print(f"  render        first {times[0] * 1000:,.0f} ms, then median {statistics.median(times[1:] or times) * 1000:,.0f} ms"
          f" ({args.repeat} renders)")
    if args.out:
        args.out.write_text(page, encoding="utf-8")
        print(f"  written       {args.out}")


if __name__ == "__main__":
    main()
