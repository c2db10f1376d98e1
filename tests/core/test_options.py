"""The options record: keywords go to their family, values are checked before any work, and every command
that takes an option family takes it the same way."""

from __future__ import annotations

import inspect
import math

import pytest

from onnxport import api
from onnxport.cli import app
from onnxport.core.errors import UsageError
from onnxport.core.options import (
    QUICK_BENCH,
    BenchOptions,
    OptimizeOptions,
    Options,
    RuntimeOptions,
    from_keywords,
)
from onnxport.core.records import Tolerance


def test_keywords_go_to_their_family():
    o = from_keywords(inputs=["x:float32[batch,8]"], dims=["batch=1..4"], exporter="torchscript", opset=18,
                      tolerance=Tolerance(1e-3, 1e-2), variants=["int8"], budget=30.0, seq=64, device="cpu",
                      custom_op_libraries=["a.so"], force=True, command="onnxport convert")
    assert o.load.inputs == ("x:float32[batch,8]",) and o.load.dims == ("batch=1..4",)
    assert (o.export.exporter, o.export.opset) == ("torchscript", 18)
    assert o.proof.tolerance == Tolerance(1e-3, 1e-2)
    assert o.optimize == OptimizeOptions(("int8",), 30.0, 64)
    assert o.runtime.custom_op_libraries == ("a.so",) and o.force and o.command == "onnxport convert"
    assert o.bench is None  # no benchmark unless asked for
    assert from_keywords(threads=3).bench == BenchOptions(threads=3)


def test_an_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="exporterr"):
        from_keywords(exporterr="dynamo")


def test_the_record_is_frozen_and_hashable():
    o = from_keywords(inputs=["x:float32[b,8]"], batches=[1, 2])
    with pytest.raises(AttributeError):
        o.force = True  # type: ignore[misc]
    assert hash(o.load) and o.bench.batches == (1, 2)


@pytest.mark.parametrize(("kw", "named"), [
    ({"tolerance": Tolerance(math.nan, 1e-3)}, "--atol"),
    ({"tolerance": Tolerance(1e-4, math.inf)}, "--rtol"),
    ({"tolerance": Tolerance(-1.0, 1e-3)}, "--atol"),
    ({"budget": 0.0}, "--budget"),
    ({"budget": math.nan}, "--budget"),
    ({"seq": 0}, "--seq"),
    ({"opset": 0}, "--opset"),
    ({"device": "tpu"}, "--device"),
    ({"batches": (0,)}, "--batch"),
    ({"threads": -2}, "--threads"),
    ({"max_seconds": 0.0}, "--seconds"),
    ({"seq_lens": (0,)}, "--seq"),
])
def test_bad_values_are_refused_before_any_work(kw, named):
    with pytest.raises(UsageError) as e:
        from_keywords(**kw).checked()
    assert named in e.value.message and e.value.exit_code == 2


def test_the_api_refuses_bad_values_before_loading(tmp_path):
    out = tmp_path / "o"
    with pytest.raises(UsageError, match="--atol"):
        api.export("no/such/file.py:Model", out, tolerance=Tolerance(math.nan, 1e-3))
    with pytest.raises(UsageError, match="--batch"):
        api.benchmark("no/such/file.py:Model", out, bench={"batches": (0,)})
    assert not out.exists()


def test_convert_runs_a_short_benchmark_at_the_traffic_length():
    """api.convert's default benchmark is the quick one, at --seq when given (what the CLI's convert runs)."""
    seen = {}

    def fake(source, out, options, progress):
        seen["options"] = options
        return {}

    orig = api.pipeline.run_pipeline
    api.pipeline.run_pipeline = fake
    try:
        api.convert("x.py:M", "o", seq=64)
        assert seen["options"].bench == BenchOptions(**{**QUICK_BENCH.__dict__, "seq_lens": (64,)})
        assert seen["options"].optimize.variants == "auto"
        api.convert("x.py:M", "o", bench={}, optimize=False)
        assert seen["options"].bench is None and seen["options"].optimize.variants is None
        given = Options(runtime=RuntimeOptions(device="cpu"), optimize=OptimizeOptions(variants=("int8",)))
        api.convert("x.py:M", "o", options=given)
        assert seen["options"].optimize.variants == ("int8",)
    finally:
        api.pipeline.run_pipeline = orig


def _options_of(command: str) -> dict[str, inspect.Parameter]:
    fn = next(c.callback for c in app.registered_commands if (c.name or c.callback.__name__) == command)
    return dict(inspect.signature(fn).parameters)


@pytest.mark.parametrize("option", ["device", "custom_op_library", "trt_fp16", "atol", "rtol", "samples", "input",
                                    "dim", "task", "out", "force", "json_out"])
def test_every_command_that_takes_an_option_takes_it_the_same_way(option):
    takers = [c for c in ("convert", "export", "compare", "optimize", "bench") if option in _options_of(c)]
    assert len(takers) == 5, takers  # the whole family, on every command that proves against PyTorch
    first = _options_of(takers[0])[option]
    for command in takers[1:]:
        p = _options_of(command)[option]
        assert (p.default, p.annotation) == (first.default, first.annotation), command


def test_optimize_takes_the_device_and_serve_the_runtime_group():
    assert "device" in _options_of("optimize") and "budget" in _options_of("optimize")
    assert {"device", "custom_op_library", "trt_fp16"} <= set(_options_of("serve"))


def test_optimize_device_reaches_the_runtime_check(tmp_path):
    """`optimize --device cuda` is taken (no GPU here: exit 4 naming what to install), not an unknown option."""
    from tests.conftest import run_cli

    proc = run_cli("optimize", "tests/fixtures/models.py:TinyMLP", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o"),
                   "--device", "cuda")
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert "cuda" in proc.stderr and "No such option" not in proc.stderr
