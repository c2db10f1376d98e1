"""Models whose weights live in external data files, tested with a lowered threshold (the same code paths as a
model over 2 GB; benchmarks/large_model.py runs a real one): convert with every variant, check by path,
optimize, Triton repository, serving."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxport import api
from onnxport.core.errors import UsageError
from onnxport.core.onnxfile import copy_model, external_data_files
from onnxport.serve import serve_app
from onnxport.serve.repository import triton_repository
from tests.conftest import MODELS, load_report
from tests.fixtures import forked_cli
from tests.serve.test_serve import post, running

THRESHOLD = "4096"  # bytes: TinyMLP(32, 64) holds 9 KB of weights, its 8 KB fc1 weight goes to the .data file
SPEC = {"inputs": ["x:float32[batch,32]"], "dims": ["batch=1..16"], "model_args": {"features": 32, "hidden": 64}}
SOURCE = f"{MODELS}:TinyMLP"
cli = forked_cli.cli  # a fixture: commands forked from one process that did the CLI's imports once


def ort_outputs(path, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def data_of(path) -> list:
    return [p.name for p in external_data_files(path)]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("external") / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ONNXPORT_EXTERNAL_DATA_THRESHOLD", THRESHOLD)
        rep = api.convert(SOURCE, out, exporter="torchscript", variants="slim,ort,fp16,int8", bench={}, **SPEC)
    return out, rep


def test_convert_writes_external_data_and_proves_it(converted):
    out, rep = converted
    load_report(out)
    assert rep["status"] == "ok", rep["summary"]
    assert rep["export"]["external_data"] is True
    assert data_of(out / "model.onnx") == ["model.onnx.data"]
    assert (out / "model.onnx.data").stat().st_size >= 8192 > (out / "model.onnx").stat().st_size
    assert all(c["passed"] for c in rep["validation"]["cases"]) and len(rep["validation"]["cases"]) >= 4
    assert rep["check"]["bytes"] == (out / "model.onnx").stat().st_size + (out / "model.onnx.data").stat().st_size
    assert not list(out.glob(".onnxport-*"))  # the work folder and its data file are gone


def test_every_variant_keeps_its_weights_beside_it(converted):
    out, rep = converted
    by = {v["name"]: v for v in rep["variants"]}
    assert {"slim", "ort", "fp16", "int8"} <= set(by)
    for name in ("slim", "ort", "fp16"):
        assert by[name]["passed"], (name, by[name].get("reason"))
        path = out / by[name]["path"]
        assert data_of(path) == [f"{name}.onnx.data"], name
        assert (out / "variants" / f"{name}.onnx.data").stat().st_size > 0
    assert by["fp16"]["max_abs_err"] < 1e-2
    assert (out / "variants" / "int8.onnx").is_file()  # built and judged by its metric (random weights may fail it)
    assert by["int8"].get("metric") is not None and "building failed" not in str(by["int8"].get("reason"))
    best = rep["best"]["name"]
    assert data_of(out / "best.onnx") == (["best.onnx.data"] if best != "int8" else data_of(out / "best.onnx"))
    x = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    np.testing.assert_allclose(ort_outputs(out / "best.onnx", x), ort_outputs(out / "model.onnx", x), atol=1e-2)
    for path in (out / "model.onnx.data", out / "variants" / "slim.onnx.data"):
        assert path.stat().st_mode & 0o044 == 0o044  # readable by the serving user, not only the owner


def test_check_by_path_reads_the_data_file(converted, cli):
    out, _ = converted
    res = api.check_file(out / "model.onnx")
    assert res.ok
    assert res.to_dict()["bytes"] == sum(p.stat().st_size for p in (out / "model.onnx", out / "model.onnx.data"))
    proc = cli("check", str(out / "model.onnx"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["parameters"] == 32 * 64 + 64 + 64 * 3 + 3


def test_check_names_a_missing_data_file(converted, tmp_path):
    out, _ = converted
    (tmp_path / "model.onnx").write_bytes((out / "model.onnx").read_bytes())  # without model.onnx.data
    res = api.check_file(tmp_path / "model.onnx")
    assert not res.ok
    diag = next(d for d in res.diagnostics if d.code == "onnx-checker")
    assert "model.onnx.data" in diag.message and "external data file that is missing" in diag.hint


def test_optimize_an_external_data_model(converted, tmp_path):
    out, _ = converted
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ONNXPORT_EXTERNAL_DATA_THRESHOLD", THRESHOLD)
        rep = api.optimize_file(SOURCE, out / "model.onnx", tmp_path / "opt", variants="slim,ort", **SPEC)
    assert rep["status"] == "ok" and rep["export"]["external_data"] is True
    assert [(v["name"], v["passed"]) for v in rep["variants"]] == [("export", True), ("slim", True), ("ort", True)]
    assert data_of(tmp_path / "opt" / "variants" / "ort.onnx") == ["ort.onnx.data"]
    assert data_of(tmp_path / "opt" / "best.onnx") == ["best.onnx.data"]


def test_triton_repository_and_serving(converted, tmp_path):
    out, _ = converted
    repo = triton_repository(out, tmp_path / "repo")
    version = repo.model_dir / "1"
    data = data_of(version / "model.onnx")  # best.onnx's data file, copied under the name the graph refers to
    assert data == data_of(out / "best.onnx") == ["best.onnx.data"]
    assert sorted(p.name for p in version.iterdir()) == ["best.onnx.data", "model.onnx"]
    assert (version / "best.onnx.data").read_bytes() == (out / "best.onnx.data").read_bytes()
    x = np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)
    expected = ort_outputs(out / "best.onnx", x)
    np.testing.assert_allclose(ort_outputs(version / "model.onnx", x), expected, rtol=1e-6, atol=1e-6)
    with running(serve_app(tmp_path / "repo")) as url:
        body = {"inputs": [{"name": "x", "shape": [2, 32], "datatype": "FP32", "data": x.ravel().tolist()}]}
        status, _, raw = post(url, f"/v2/models/{repo.name}/infer", json.dumps(body).encode())
    assert status == 200, raw[:500]
    got = np.array(json.loads(raw)["outputs"][0]["data"], np.float32).reshape(2, 3)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_copy_model_copies_bytes_and_renames_the_data(converted, tmp_path):
    out, _ = converted
    copy_model(out / "model.onnx", tmp_path / "sub" / "copy.onnx")
    assert data_of(tmp_path / "sub" / "copy.onnx") == ["copy.onnx.data"]
    assert (tmp_path / "sub" / "copy.onnx.data").read_bytes() == (out / "model.onnx.data").read_bytes()
    assert data_of(out / "model.onnx") == ["model.onnx.data"]  # the source is untouched
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    (lonely / "m.onnx").write_bytes((out / "model.onnx").read_bytes())  # refers to model.onnx.data, absent
    with pytest.raises(UsageError, match="missing"):
        copy_model(lonely / "m.onnx", tmp_path / "x.onnx")


@pytest.mark.slow
def test_dynamo_export_above_the_threshold_through_the_cli(tmp_path, monkeypatch, cli):
    monkeypatch.setenv("ONNXPORT_EXTERNAL_DATA_THRESHOLD", THRESHOLD)
    out = tmp_path / "out"
    res = cli("convert", SOURCE, "-i", "x:float32[batch,32]", "-d", "batch=1..16", "--model-args",
                  '{"features": 32, "hidden": 64}', "--exporter", "dynamo", "--variants", "slim", "--no-bench",
                  "-o", str(out), "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    rep = json.loads(res.stdout)
    assert rep["export"]["exporter"] == "dynamo" and rep["export"]["external_data"] is True
    assert data_of(out / "model.onnx") == ["model.onnx.data"]
    assert data_of(out / "variants" / "slim.onnx") == ["slim.onnx.data"]
    model = onnx.load(str(out / "model.onnx"))  # loads the weights from the data file
    assert sum(int(np.prod(t.dims)) for t in model.graph.initializer) == 32 * 64 + 64 + 64 * 3 + 3


def test_check_finds_external_data_shorter_than_declared(tmp_path):
    """A .data file truncated after the save: onnx.checker says nothing; check says where it ends."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    from onnxport.prove.check import check

    w = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(model, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.onnx.data",
                    size_threshold=0)
    assert check(tmp_path / "m.onnx").ok
    data = tmp_path / "m.onnx.data"
    data.write_bytes(data.read_bytes()[:1000])
    got = check(tmp_path / "m.onnx")
    assert not got.ok and "holds 1000 bytes" in got.checker_error
    assert [d.code for d in got.diagnostics if d.severity == "error"] == ["external-data-short"]
