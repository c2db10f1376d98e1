"""Batches through IO binding (serve/device_run.py), run for real on the CPU provider: the buffers of a shape are
bound once and refilled, two batches may be in flight, and every request's answer equals the request run alone,
also end to end through the server with binary tensors at concurrency 64."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as th

from onnxport.serve.app import build_app
from onnxport.serve.batcher import Batcher
from onnxport.serve.device_run import PIPELINE, DeviceRunner, bucket, runs_on_cuda
from onnxport.serve.models import discover
from onnxport.serve.served import Metrics, load
from tests.serve.test_serve import metric, mlp_out, running  # noqa: F401 - mlp_out: the shared fixture


@pytest.fixture(scope="module")
def sess(mlp_out):  # noqa: F811
    return ort.InferenceSession(str(mlp_out / "model.onnx"), providers=["CPUExecutionProvider"])


def _rows(n: int, seed: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1 + i % 3, 8)).astype(np.float32) for i in range(n)]


def test_a_shape_is_bound_once_and_its_buffers_refilled(sess):
    runner = DeviceRunner(sess, [o.name for o in sess.get_outputs()], "cpu")
    assert not runs_on_cuda(sess)
    for x in _rows(6):
        x2 = np.concatenate([x, x])
        got = runner({"x": x2})["output"]
        np.testing.assert_allclose(got, sess.run(None, {"x": x2})[0], rtol=1e-6, atol=1e-7)
    assert runner.bound == 3  # batch 2, 4 and 6: one set of buffers each, refilled for the next request
    padded = DeviceRunner(sess, ["output"], "cpu", buckets=16)
    for x in _rows(9):  # 1, 2 and 3 rows: padded to 1, 2 and 4
        np.testing.assert_allclose(padded({"x": x})["output"], sess.run(None, {"x": x})[0], rtol=1e-6, atol=1e-7)
    assert padded.bound == 3 and [bucket(n) for n in (1, 2, 3, 5, 16, 17)] == [1, 2, 4, 8, 16, 32]
    padded({"x": _rows(4)[2]})  # 3 rows again: the 4-row buffers
    assert padded.bound == 3
    capped = DeviceRunner(sess, ["output"], "cpu", buckets=6)
    assert capped({"x": np.ones((5, 8), np.float32)})["output"].shape == (5, 3) and capped.bound == 1  # 6 rows
    kept = np.ones((2, 8), np.float32)
    runner({"x": kept})
    runner({"x": np.zeros((2, 8), np.float32)})
    assert kept.min() == 1.0  # a refill writes the bound buffer, never the caller's array


def test_batches_in_flight_answer_each_request_as_if_it_ran_alone(sess):
    runner = DeviceRunner(sess, ["output"], "cpu")
    flying, most = 0, 0
    lock = threading.Lock()

    def slow(feeds):  # long enough that a second batch starts while one runs
        nonlocal flying, most
        with lock:
            flying += 1
            most = max(most, flying)
        time.sleep(0.02)
        try:
            return runner(feeds)
        finally:
            with lock:
                flying -= 1

    sizes: list[int] = []
    batcher = Batcher(slow, batched=True, max_batch=8, max_delay_ms=5, pipeline=PIPELINE,
                      on_batch=lambda rows, s: sizes.append(rows))
    xs = _rows(48)

    async def go():
        try:
            return await asyncio.gather(*(batcher.infer({"x": x}, x.shape[0]) for x in xs))
        finally:
            await batcher.close()

    results = asyncio.run(go())
    for x, (out, stats) in zip(xs, results):
        np.testing.assert_allclose(out["output"], sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
        assert stats.batch_rows >= x.shape[0]
    assert sum(sizes) == sum(x.shape[0] for x in xs) and len(sizes) < len(xs)
    assert most == 2  # two batches in flight, never more


def test_served_with_io_binding_binary_tensors_at_concurrency_64(mlp_out, sess):  # noqa: F811
    metrics = Metrics()
    models = [load(source, 16, 20, metrics, io_binding=True) for source in discover(mlp_out)]
    runner = models[0].batcher._run
    assert isinstance(runner, DeviceRunner) and runner.buckets == 16 and models[0].batcher.pipeline == PIPELINE
    xs = _rows(64, seed=11)
    barrier = threading.Barrier(64)
    with running(build_app(models, metrics, max_body_bytes=1 << 20)) as url:
        def one(x: np.ndarray) -> np.ndarray:
            c = th.InferenceServerClient(url)
            try:
                inp = th.InferInput("x", list(x.shape), "FP32")
                inp.set_data_from_numpy(x, binary_data=True)
                barrier.wait(10)
                return c.infer("TinyMLP", [inp], outputs=[th.InferRequestedOutput("output", binary_data=True)]
                               ).as_numpy("output")
            finally:
                c.close()

        with ThreadPoolExecutor(64) as pool:
            results = list(pool.map(one, xs))
        batches = metric(url, "onnxport_batch_size_count", "TinyMLP")
    for x, got in zip(xs, results):
        np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert batches < 64
