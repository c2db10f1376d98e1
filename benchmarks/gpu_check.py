"""The one GPU check: every GPU measurement of onnxport in one call (under 8 minutes on 16 cores), one JSON.

1. ``points``: benchmarks/gpu.py's four points (MiniLM-shaped BERT 1×128 and 32×128, resnet18 b1 and b64):
   PyTorch eager, torch.compile fp16 (reduce-overhead) and onnxport's variants (fp32, tf32, fp16, fp16-nhwc,
   fp16-sdpa, CUDA graph, the best) in the same run, with the target best ≤ 0.9× torch.compile.
2. ``cli_vs_harness``: each proven variant's latency in the CLI's table (report.json ``variants[].latency_ms`` at
   batch 1, timed by onnxport device-resident) against the harness's median for the same file under the same
   session options (gpu.py's IO binding and CUDA-graph replay); within 10 %.
3. ``serve``: ``onnxport serve`` of resnet18's output folder (best.onnx) on the device, binary tensors,
   concurrency 64: requests/s, latency percentiles, and every answer against the same request run alone
   (within the best variant's tolerance).
4. ``attention_kernels``: the lines onnxruntime prints with ``ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO=1`` for each
   proven fp16 file of the BERT at each size (which fused kernel runs on this GPU).
5. ``families``: every other benchmarks/*.py that defines ``gpu_check(work: Path, smoke: bool) -> dict`` (the
   decoder and encoder-decoder checks) is called, its dict kept; none: skipped, with a line.

On the GPU machine (see ../shared/gpu/README.md: onnxruntime-gpu arrives in parts through .gpu/device.sh):

    bash .gpu/device.sh run python3 benchmarks/gpu_check.py --json $OUT/gpu_check.json
    python benchmarks/gpu_check.py --cpu-smoke --json /tmp/gpu_check.json   # a tiny CNN on the CPU, every step

Without CUDA (and without --cpu-smoke) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))
RESULT = HERE / "results" / "gpu_check.json"
CLI_WITHIN = 0.10  # the CLI's figure within 10 % of the harness's
TARGET_RATIO = 0.9  # the proven best at most 0.9× torch.compile fp16
SERVE_CONCURRENCY = 64
SERVE_TARGET_RPS = 340  # 10× the 34 requests/s of JSON at concurrency 16


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


harness = _module("gpu_bench", HERE / "gpu.py")


# --------------------------------------------------------------------------- 1. the four points


def points(work: Path, device: str, runs: int, warmup: int, smoke: bool) -> tuple[list[dict], list]:
    """gpu.py's table (torch.compile in the same run) and the cases it measured (their folders under ``work``)."""
    cases = (harness.SMOKE_CNN,) if smoke else harness.GPU_CASES  # gpu.py's own smoke runs its tiny BERT
    table = [row for case in cases for row in harness.measure_case(case, work, device, runs, warmup, smoke)]
    for entry in table:
        ref = entry["ms"].get("torch.compile fp16")
        best = next((v for k, v in entry["ms"].items() if k.startswith("onnxport best")), None)
        ratio = best / ref if isinstance(best, float) and isinstance(ref, float) else None
        entry["best_vs_compile"] = None if ratio is None else round(ratio, 3)
        entry["target_met"] = None if ratio is None else ratio <= TARGET_RATIO
    return table, list(cases)


# --------------------------------------------------------------------------- 2. the CLI's table against the harness


def cli_vs_harness(case, out: Path, device: str, runs: int, warmup: int) -> list[dict]:
    """Each proven, timed variant of ``out``'s report: the CLI's batch-1 ms against the harness's for its file."""
    report = json.loads((out / "report.json").read_text())
    batch, seq = 1, case.seq
    feeds = harness.feeds_for(case, batch, seq)
    sync = harness._sync(device)
    rows = []
    for v in report.get("variants", []):
        cli = (v.get("latency_ms") or {}).get(str(batch))
        if not v.get("passed") or not v.get("path") or not cli or v.get("backend") == "openvino":
            continue
        options = v.get("session_options") or {}
        try:
            ms = harness.median_ms(harness.ort_step(out / v["path"], options, out, feeds, device), runs, warmup,
                                   sync)
        except Exception as e:  # noqa: BLE001 - one variant failing must not hide the others
            rows.append({"model": case.key, "variant": v["name"], "cli_ms": cli,
                         "error": str(e).splitlines()[0][:120]})
            continue
        ratio = cli / ms
        rows.append({"model": case.key, "variant": v["name"], "batch": batch, "cli_ms": round(cli, 4),
                     "harness_ms": round(ms, 4), "ratio": round(ratio, 3),
                     "within_10pct": abs(ratio - 1) <= CLI_WITHIN,
                     "best": (report.get("best") or {}).get("name") == v["name"],
                     "timing": (report.get("best") or {}).get("timing")})
    return rows


# --------------------------------------------------------------------------- which attention kernel runs

PROBE = """
import json, sys
import numpy as np
from onnxport.runtime import open_for, without_cuda_graph
path, options, out, batch, seq = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
sess = open_for(without_cuda_graph(options), out)(path)
sess.run(None, {i.name: (np.ones if "mask" in i.name else np.zeros)((batch, seq), np.int64) for i in sess.get_inputs()})
"""


def attention_kernels(case, out: Path, smoke: bool) -> dict:
    """The attention kernel onnxruntime picks for each proven fp16 file of an encoder at each size
    (``ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO=1``: the lines it prints), one subprocess per file and size."""
    report = json.loads((out / "report.json").read_text())
    found: dict = {}
    for v in report.get("variants", []):
        if not v.get("passed") or not v.get("path") or not v["name"].startswith(("fp16", "cuda-graph")):
            continue
        for batch, seq in case.sizes:
            proc = subprocess.run([sys.executable, "-c", PROBE, str(out / v["path"]),
                                   json.dumps(v.get("session_options") or {}), str(out), str(batch), str(seq)],
                                  capture_output=True, text=True, timeout=120,
                                  env=dict(os.environ, ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO="1",
                                           PYTHONPATH=os.pathsep.join(sys.path)))
            lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if "ATTENTION" in ln.upper()]
            found[f"{v['name']} {batch}x{seq}"] = sorted(set(lines))[:6] or [f"exit {proc.returncode}, no line"]
    return found


# --------------------------------------------------------------------------- 3. serve


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Client:
    """Keep-alive binary-tensor requests to one model, one connection per thread."""

    def __init__(self, port: int, model: str, name: str, output: str) -> None:
        self.port, self.model, self.name, self.output = port, model, name, output
        self._local = threading.local()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        header = json.dumps({"inputs": [{"name": self.name, "datatype": "FP32", "shape": list(x.shape),
                                         "parameters": {"binary_data_size": x.nbytes}}],
                             "outputs": [{"name": self.output, "parameters": {"binary_data": True}}]}).encode()
        conn.request("POST", f"/v2/models/{self.model}/infer", body=header + x.tobytes(),
                     headers={"Content-Type": "application/octet-stream",
                              "Inference-Header-Content-Length": str(len(header))})
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {body[:200]!r}")
        size = int(resp.getheader("Inference-Header-Content-Length"))
        meta = json.loads(body[:size])["outputs"][0]
        return np.frombuffer(body[size:], np.float32).reshape(meta["shape"])


def _start(out: Path, device: str, log: Path) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "onnxport", "serve", str(out), "--port", str(port), "--device",
                             device, "--max-batch", "64"], stdout=subprocess.DEVNULL, stderr=log.open("w"),
                            env=dict(os.environ, COLUMNS="200", PYTHONPATH=os.pathsep.join(sys.path)))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited {proc.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/v2/health/ready")
            if conn.getresponse().status == 200:
                return proc, port
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError("the server did not start in 240 s")


def _alone(out: Path, report: dict, device: str, xs: list[np.ndarray]) -> list[np.ndarray]:
    """Each distinct request run alone on the served file with the options it is served with."""
    from onnxport.runtime import SessionOptions, providers_for, session, without_cuda_graph

    best = report.get("best") or {}
    path = out / ("best.onnx" if (out / "best.onnx").is_file() else "model.onnx")
    options = SessionOptions.from_dict(best.get("session_options") or {})
    chain = providers_for(without_cuda_graph(options), out) if device == "cuda" else None
    sess = session(path, providers=chain)
    name = sess.get_inputs()[0].name
    return [sess.run(None, {name: x})[0] for x in xs]


def serve_load(out: Path, device: str, requests: int, concurrency: int, work: Path) -> dict:
    """Requests/s and latency of ``onnxport serve OUT`` at ``concurrency`` with binary tensors, every answer
    checked against the request alone (the best's recorded tolerance)."""
    report = json.loads((out / "report.json").read_text())
    inputs, outputs = report["export"]["inputs"], report["export"]["outputs"]
    shape = [1 if not isinstance(d, int) else d for d in inputs[0]["shape"]]
    if inputs[0]["dtype"] != "float32" or len(inputs) != 1:
        return {"skipped": f"serve check needs one float32 input; {out.name} has {len(inputs)}"}
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(shape, dtype=np.float32) for _ in range(16)]
    refs = _alone(out, report, device, xs)
    tol = next((v.get("tolerance") for v in report.get("variants", [])
                if v["name"] == (report.get("best") or {}).get("name")), None) or {"atol": 1e-4, "rtol": 1e-3}
    proc, port = _start(out, device, work / "serve.log")
    try:
        client = _Client(port, out.resolve().name, inputs[0]["name"], outputs[0]["name"])
        for x in xs[:4]:
            client(x)  # warm: the first batches of each size open their buffers

        def one(i: int) -> tuple[float, float]:
            t0 = time.perf_counter()
            got = client(xs[i % len(xs)])
            want = refs[i % len(xs)]
            excess = float(np.max(np.abs(got - want) - (tol["atol"] + tol["rtol"] * np.abs(want))))
            return time.perf_counter() - t0, excess

        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            done = list(pool.map(one, range(requests)))
        wall = time.perf_counter() - t0
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
    ms = sorted(d[0] * 1e3 for d in done)
    wrong = sum(1 for d in done if d[1] > 0)
    return {"model": out.name, "file": "best.onnx" if (out / "best.onnx").is_file() else "model.onnx",
            "requests": requests, "concurrency": concurrency, "binary_tensors": True, "device": device,
            "requests_per_s": round(requests / wall, 1), "p50_ms": round(statistics.median(ms), 2),
            "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2), "wrong": wrong, "errors": 0,
            "tolerance": tol, "target_rps": SERVE_TARGET_RPS, "target_met": requests / wall >= SERVE_TARGET_RPS}


# --------------------------------------------------------------------------- 4. the families' checks


def family_checks(work: Path, smoke: bool) -> dict:
    """``gpu_check(work, smoke)`` of every other benchmarks/*.py that defines it (decoder, encoder-decoder)."""
    found: dict = {}
    for path in sorted(HERE.glob("*.py")):
        if path.name in ("gpu_check.py", "gpu.py") or "def gpu_check(" not in path.read_text(encoding="utf-8"):
            continue
        try:
            found[path.stem] = _module(f"gpu_check_{path.stem}", path).gpu_check(work / path.stem, smoke)
        except Exception as e:  # noqa: BLE001 - one family failing must not hide the others
            found[path.stem] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
    if not found:
        found["skipped"] = "no benchmarks/*.py defines gpu_check(work, smoke) (the decoder checks): skipped"
        print(found["skipped"])
    return found


# --------------------------------------------------------------------------- the run


def _machine(device: str) -> dict:
    import onnxruntime as ort
    import torch

    info = {"onnxruntime": ort.__version__, "providers": ort.get_available_providers(), "torch": torch.__version__,
            "cpus": os.cpu_count()}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    with contextlib.suppress(Exception):
        info["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                        timeout=10).stdout.strip() or None
    return info


def run_all(args: argparse.Namespace, device: str, work: Path) -> dict:
    smoke = args.cpu_smoke
    runs, warmup = (min(args.runs, 5), min(args.warmup, 2)) if smoke else (args.runs, args.warmup)
    t0 = time.perf_counter()
    table, cases = points(work, device, runs, warmup, smoke)
    print(harness.render(table), flush=True)
    versus = [row for case in cases for row in cli_vs_harness(case, work / case.key, device, runs, warmup)]
    kernels = {c.key: attention_kernels(c, work / c.key, smoke) for c in cases if c.seq is not None}
    served = cases[-1].key  # resnet18 on the GPU, a tiny CNN in the smoke
    requests = 64 if smoke else args.requests
    try:
        serve = serve_load(work / served, device, requests, SERVE_CONCURRENCY, work)
    except Exception as e:  # noqa: BLE001 - the other checks still count
        serve = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    families = family_checks(work, smoke)
    return {"created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": _machine(device),
            "device": device, "runs": runs, "warmup": warmup, "statistic": "median ms",
            "points": table, "cli_vs_harness": versus, "attention_kernels": kernels, "serve": serve,
            "families": families,
            "wall_seconds": round(time.perf_counter() - t0, 1)}


def render(result: dict) -> str:
    lines = ["", "CLI table vs harness (batch 1, ms):"]
    for r in result["cli_vs_harness"]:
        mark = "" if "ratio" not in r else ("✓" if r["within_10pct"] else "✗ (over 10 %)")
        lines.append(f"  {r['model']:9s} {r['variant']:12s} cli {r.get('cli_ms')}  harness {r.get('harness_ms')} "
                     f" {r.get('ratio', r.get('error'))} {mark}")
    s = result["serve"]
    lines.append(f"serve: {json.dumps(s)}")
    lines.append(f"families: {json.dumps(result['families'])[:400]}")
    lines.append(f"wall {result['wall_seconds']} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="a tiny CNN on the CPU: every step once")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--requests", type=int, default=3000, help="serve check: requests at concurrency 64")
    parser.add_argument("--json", type=Path, default=None, help=f"where the JSON goes (default: {RESULT})")
    parser.add_argument("--work", type=Path, help="where onnxport's outputs go (default: a temporary folder)")
    args = parser.parse_args(argv)
    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        print("benchmarks/gpu_check.py needs a CUDA GPU (torch.cuda.is_available() is False); --cpu-smoke runs "
              "every step on the CPU")
        return 0
    device = "cpu" if args.cpu_smoke else "cuda"
    with tempfile.TemporaryDirectory(prefix="onnxport-gpu-check-") as tmp:
        result = run_all(args, device, args.work or Path(tmp))
    print(render(result))
    target = args.json or RESULT
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
