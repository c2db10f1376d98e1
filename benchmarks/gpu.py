"""GPU benchmark: PyTorch (eager fp32, eager fp16, torch.compile reduce-overhead fp16) against onnxport's proven
variants (fp32, tf32, fp16, fp16-nhwc, fp16-sdpa, fp16 + CUDA graph, the chosen best) on a MiniLM-shaped BERT (random weights) at
1×128 and 32×128 and on resnet18 (``weights=None``) at batch 1 and 64.

Timing: each callable is warmed up, then run ``--runs`` times (200), each run between two
``torch.cuda.synchronize()`` calls; the median in ms. ONNX Runtime runs through IO binding with inputs and
outputs on the GPU (a CUDA graph: fixed buffers, one capture per shape), with each variant's recorded session
options (report ``variants[].session_options``). One table, ratios against torch.compile, and the targets:
BERT 1×128 ≤ 0.40 ms, 32×128 ≤ 0.90 ms; resnet18 b1 ≤ 0.45 ms, b64 ≤ 2.0 ms.

    python benchmarks/gpu.py                 # on a CUDA machine with onnxruntime-gpu
    python benchmarks/gpu.py --cpu-smoke     # a tiny BERT on the CPU: runs every code path once, quickly

Without CUDA (and without --cpu-smoke) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

TARGETS_MS = {("bert", 1): 0.40, ("bert", 32): 0.90, ("resnet18", 1): 0.45, ("resnet18", 64): 2.0}
BERT_SHAPE = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536}
TINY_SHAPE = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 37}
VOCAB = 1000


# --------------------------------------------------------------------------- models (loaded by onnxport by name)


def _bert(shape: dict, attention: str | None = None):
    import torch
    import transformers

    class Encoder(torch.nn.Module):
        """A BertModel returning last_hidden_state; ``config`` stays visible for the transformer fusions."""

        def __init__(self) -> None:
            super().__init__()
            cfg = transformers.BertConfig(vocab_size=VOCAB, max_position_embeddings=512, **shape)
            if attention:
                cfg._attn_implementation = attention
            torch.manual_seed(0)
            self.bert = transformers.BertModel(cfg, add_pooling_layer=False)
            self.config = cfg

        def set_attn_implementation(self, implementation: str) -> None:
            self.bert.set_attn_implementation(implementation)  # the fusions re-export with eager attention

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return Encoder().eval()


def minilm_bert():
    """The MiniLM-shaped BERT (6 layers, hidden 384, 12 heads), random weights."""
    return _bert(BERT_SHAPE)


def tiny_bert():
    """A one-layer BERT with eager attention (whose graph the transformer fusions know as exported)."""
    return _bert(TINY_SHAPE, "eager")


def resnet18():
    import torch
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval()


def tiny_cnn():
    """A small convolutional classifier on 32×32 images (conv, batch norm, pooling): benchmarks/gpu_check.py's
    CPU smoke serves it."""
    import torch

    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(16, 10)).eval()


@dataclass(frozen=True)
class Case:
    """One model and the (batch, seq) sizes it is timed at."""

    key: str
    factory: str
    inputs: tuple[str, ...]
    dims: tuple[str, ...]
    sizes: tuple[tuple[int, int | None], ...]
    seq: int | None
    side: int = 224  # an image model's height and width


GPU_CASES = (
    Case("bert", "minilm_bert", (f"input_ids:int64[batch,seq]{{0..{VOCAB - 1}}}", "attention_mask:int64[batch,seq]{1..1}"),
         ("batch=1..64", "seq=1..128"), ((1, 128), (32, 128)), 128),
    Case("resnet18", "resnet18", ("x:float32[batch,3,224,224]",), ("batch=1..64",), ((1, None), (64, None)), None),
)
SMOKE_CNN = Case("cnn", "tiny_cnn", ("x:float32[batch,3,32,32]",), ("batch=1..8",), ((1, None),), None, 32)
SMOKE_CASES = (
    Case("bert", "tiny_bert", (f"input_ids:int64[batch,seq]{{0..{VOCAB - 1}}}", "attention_mask:int64[batch,seq]{1..1}"),
         ("batch=1..4", "seq=1..16"), ((1, 8),), 8),
)


# --------------------------------------------------------------------------- timing


def median_ms(step: Callable[[], object], runs: int, warmup: int, sync: Callable[[], None]) -> float:
    """Median ms of ``runs`` calls of ``step``, each between two ``sync()`` calls, after ``warmup`` calls."""
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(runs):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def feeds_for(case: Case, batch: int, seq: int | None) -> dict[str, np.ndarray]:
    """Inputs at one size: token ids and an all-ones mask, or an image batch."""
    rng = np.random.default_rng(0)
    if case.seq is None:
        return {"x": rng.standard_normal((batch, 3, case.side, case.side), dtype=np.float32)}
    return {"input_ids": rng.integers(0, VOCAB, (batch, seq), dtype=np.int64),
            "attention_mask": np.ones((batch, seq), dtype=np.int64)}


def torch_rows(model, feeds: dict[str, np.ndarray], device: str, runs: int, warmup: int,
               compile_: bool) -> dict[str, float | str]:
    """PyTorch eager fp32, eager fp16 and torch.compile(mode="reduce-overhead") fp16, median ms."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out: dict[str, float | str] = {}
    args32 = [torch.from_numpy(v).to(device) for v in feeds.values()]
    with torch.inference_mode():
        m32 = model.to(device).float()
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        out["torch eager fp32"] = median_ms(lambda: m32(*args32), runs, warmup, sync)
        m16 = model.to(device).half()
        args16 = [a.half() if a.is_floating_point() else a for a in args32]
        out["torch eager fp16"] = median_ms(lambda: m16(*args16), runs, warmup, sync)
        if compile_:
            compiled = torch.compile(m16, mode="reduce-overhead")
            out["torch.compile fp16"] = median_ms(lambda: compiled(*args16), runs, max(warmup, 10), sync)
        else:
            out["torch.compile fp16"] = "skipped (--cpu-smoke)"
        model.float().cpu()
    return out


def ort_step(path: Path, options: dict, out_dir: Path, feeds: dict[str, np.ndarray], device: str):
    """One IO-bound run of ``path`` under its variant's ``options`` (inputs and outputs on ``device``)."""
    import onnxruntime as ort

    from onnxport import optimize

    sess = optimize.open_for(options, out_dir)(path)
    if isinstance(sess, optimize.GraphSessions):
        sess.run(None, feeds)  # captures the graph of this shape
        runner = next(iter(sess.by_shape.values()))
        return lambda: runner.session.run_with_iobinding(runner.binding)
    binding = sess.io_binding()
    keep = []
    for meta in sess.get_inputs():
        value = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(feeds[meta.name]), device, 0)
        keep.append(value)
        binding.bind_ortvalue_input(meta.name, value)
    for meta in sess.get_outputs():
        binding.bind_output(meta.name, device, 0)
    return lambda: (keep, sess.run_with_iobinding(binding))


# --------------------------------------------------------------------------- onnxport


def convert(case: Case, out: Path, device: str, variants: list[str]) -> dict:
    """Export, prove and optimize ``case`` with onnxport on ``device``; the report."""
    from onnxport import api

    return api.convert(f"{Path(__file__).resolve()}:{case.factory}", out, inputs=list(case.inputs),
                       dims=list(case.dims), device=device, variants=variants, seq=case.seq, bench={}, force=True)


def onnx_variants(report: dict, out: Path, device: str) -> dict[str, tuple[Path, dict] | str]:
    """The rows to time: label -> (file, session options), or why the row is missing."""
    by = {v["name"]: v for v in report.get("variants", [])}
    cpu = {"provider": "CPUExecutionProvider"}
    base = {"provider": "CUDAExecutionProvider", "use_tf32": False} if device == "cuda" else cpu

    def row(name: str, options: dict | None = None) -> tuple[Path, dict] | str:
        v = by.get(name)
        if v is None or not v.get("passed") or not v.get("path"):
            return f"not proven: {(v or {}).get('reason') or 'not built'}"[:60]
        return out / v["path"], options or v.get("session_options") or base

    rows: dict[str, tuple[Path, dict] | str] = {"onnxport fp32": row("export", base)}
    rows["onnxport tf32"] = row("tf32") if device == "cuda" else "n/a on the CPU"
    rows["onnxport fp16"] = row("fp16", base)
    if device == "cuda":  # each with its recorded options: NHWC for a CNN, the attention kernels for an encoder
        for name in ("fp16-nhwc", "fp16-sdpa"):
            rows[f"onnxport {name}"] = row(name)
    graph = {**base, "enable_cuda_graph": True, "io_binding": True, "graph_per_shape": True}
    rows["onnxport fp16 + CUDA graph"] = row("fp16", graph)
    best = report.get("best")
    if best:
        rows[f"onnxport best ({best['name']})"] = (out / "best.onnx", best.get("session_options") or base)
    return rows


# --------------------------------------------------------------------------- table


def measure_case(case: Case, work: Path, device: str, runs: int, warmup: int, smoke: bool) -> list[dict]:
    """Every row of one model at each of its sizes."""
    variants = ["fp16"] if smoke else ["fp16", "tf32", "fp16-nhwc", "fp16-sdpa", "cuda-graph"]
    out = work / case.key
    report = convert(case, out, device, variants)
    rows = onnx_variants(report, out, device)
    model = globals()[case.factory]()
    sync = _sync(device)
    table = []
    for batch, seq in case.sizes:
        feeds = feeds_for(case, batch, seq)
        times: dict[str, float | str] = torch_rows(model, feeds, device, runs, warmup, compile_=not smoke)
        for label, what in rows.items():
            if isinstance(what, str):
                times[label] = what
                continue
            try:
                times[label] = median_ms(ort_step(*what, out, feeds, device), runs, warmup, sync)
            except Exception as e:  # noqa: BLE001 - one row failing must not hide the others
                times[label] = f"failed: {str(e).splitlines()[0][:50]}"
        table.append({"model": case.key, "batch": batch, "seq": seq, "ms": times,
                      "target_ms": None if smoke else TARGETS_MS.get((case.key, batch)),
                      "best": (report.get("best") or {}).get("name")})
    return table


def _sync(device: str) -> Callable[[], None]:
    if device == "cuda":
        import torch

        return torch.cuda.synchronize
    return lambda: None


def render(table: list[dict]) -> str:
    """One text table: median ms per row and size, and the ratio against torch.compile (< 1: faster)."""
    lines = []
    for entry in table:
        size = f"{entry['batch']}×{entry['seq']}" if entry["seq"] else f"b{entry['batch']}"
        target = f" (target ≤ {entry['target_ms']} ms)" if entry["target_ms"] else ""
        lines.append(f"{entry['model']} {size}{target}")
        ref = entry["ms"].get("torch.compile fp16")
        for label, ms in entry["ms"].items():
            if isinstance(ms, str):
                lines.append(f"  {label:34s} {ms}")
                continue
            ratio = f"{ms / ref:6.2f}× torch.compile" if isinstance(ref, float) else ""
            hit = " ✓" if entry["target_ms"] and label.startswith("onnxport best") and ms <= entry["target_ms"] else ""
            lines.append(f"  {label:34s} {ms:8.3f} ms  {ratio}{hit}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="a tiny BERT on the CPU, a few runs")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the table as JSON here")
    parser.add_argument("--work", type=Path, help="where the onnxport outputs go (default: a temporary folder)")
    args = parser.parse_args(argv)
    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        print("benchmarks/gpu.py needs a CUDA GPU (torch.cuda.is_available() is False); --cpu-smoke runs a tiny "
              "CPU check of the script")
        return 0
    device, cases = ("cpu", SMOKE_CASES) if args.cpu_smoke else ("cuda", GPU_CASES)
    runs, warmup = (min(args.runs, 5), min(args.warmup, 2)) if args.cpu_smoke else (args.runs, args.warmup)
    with tempfile.TemporaryDirectory(prefix="onnxport-gpu-bench-") as tmp:
        work = args.work or Path(tmp)
        table = [row for case in cases for row in measure_case(case, work, device, runs, warmup, args.cpu_smoke)]
    print(render(table))
    if args.json:
        args.json.write_text(json.dumps(table, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
