"""How long large JSON bodies hold `onnxport serve`'s event loop: while N bodies of M MB each are being parsed,
/v2/health/ready is polled and its worst latency printed, with the server's JSON parser (orjson, falling back to
the json module) and with the json module alone, side by side in one run.

    .venv/bin/python benchmarks/serve_json.py                  # 3 bodies of 48 MB
    .venv/bin/python benchmarks/serve_json.py --mb 4 --bodies 2   # quicker
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnx
from _common import write_results
from onnx import TensorProto, helper

from onnxport.serve import listen, protocol, serve_app
from onnxport.serve.runner import Server


def relu_model(path: Path) -> Path:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def request(address: str, method: str, path: str, body: bytes | None = None) -> int:
    host, port = address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def body_of(mb: float) -> bytes:
    rows = max(1, int(mb * 2**20 / (8 * 13)))  # ~13 characters a number
    data = [round(0.123456789 * (i % 97) - 5.0, 9) for i in range(rows * 8)]
    return json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 8], "data": data}]}).encode()


def worst_health_ms(address: str, body: bytes, bodies: int) -> tuple[float, float]:
    """(worst /v2/health/ready latency in ms while ``bodies`` copies of ``body`` are posted at once, seconds the
    posts took)."""
    done = threading.Event()
    worst = 0.0

    def poll() -> None:
        nonlocal worst
        while not done.is_set():
            t0 = time.perf_counter()
            assert request(address, "GET", "/v2/health/ready") == 200
            worst = max(worst, (time.perf_counter() - t0) * 1e3)
            time.sleep(0.01)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(bodies) as pool:
        statuses = list(pool.map(lambda _: request(address, "POST", "/v2/models/relu/infer", body), range(bodies)))
    took = time.perf_counter() - t0
    done.set()
    poller.join()
    assert statuses == [200] * bodies, statuses
    return worst, took


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=48.0, help="size of each JSON body (MB)")
    ap.add_argument("--bodies", type=int, default=3, help="bodies posted at once")
    ap.add_argument("--json", type=Path, help="also write the figures to this results file")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        app = serve_app(relu_model(Path(tmp) / "relu.onnx"), max_batch=1, max_delay_ms=1,
                        max_body_bytes=int((args.mb + 1) * 2**20))
        server = Server(app, listen("127.0.0.1", 0), log_level="warning")
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        assert server.started.wait(30)
        address = f"127.0.0.1:{server.sock.getsockname()[1]}"
        body = body_of(args.mb)
        print(f"{args.bodies} bodies of {len(body) / 2**20:.1f} MB posted at once; /v2/health/ready polled meanwhile")
        results = {}
        real = protocol.orjson.loads
        for parser in ("orjson", "json"):
            if parser == "json":  # the json module alone: orjson refuses everything, as if it were not there
                def refuse(_text):
                    raise protocol.orjson.JSONDecodeError("off", "", 0)
                protocol.orjson.loads = refuse
            try:
                results[parser] = worst_health_ms(address, body, args.bodies)
            finally:
                protocol.orjson.loads = real
            print(f"{parser:>7}: worst health latency {results[parser][0]:8.1f} ms, bodies answered in "
                  f"{results[parser][1]:.2f} s")
        print(f"ratio json / orjson: health {results['json'][0] / max(results['orjson'][0], 1e-3):.1f}x, "
              f"answers {results['json'][1] / max(results['orjson'][1], 1e-3):.1f}x")
        server.stop()
        thread.join(30)
    if args.json:
        write_results(args.json, "serve_json.py", sys.argv[1:] if argv is None else argv,
                      {"body_mb": round(len(body) / 2**20, 1), "bodies": args.bodies,
                       "parsers": {k: {"worst_health_ms": round(v[0], 1), "answered_s": round(v[1], 2)}
                                   for k, v in results.items()}})


if __name__ == "__main__":
    main()
