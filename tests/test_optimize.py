"""Optimization variants: each re-proven against PyTorch, failures rejected, the fastest safe one chosen."""

from __future__ import annotations

import textwrap
from pathlib import Path

import jsonschema
import pytest

from onnxport import optimize, report
from onnxport.api import load_model
from onnxport.errors import UsageError
from onnxport.export import export
from onnxport.optimize import Variant, select_best
from tests.conftest import MODELS

FAST = {"bench_batches": (1,), "bench_seconds": 0.2}

BIG_SCALE = textwrap.dedent("""
    import torch
    from torch import nn

    class BigScale(nn.Module):
        '''Intermediate values far above fp16's 65504: fine in fp32, inf in fp16.'''

        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 4)
            self.register_buffer("scale", torch.tensor(1e5))

        def forward(self, x):
            return self.lin(x) * self.scale + self.scale
""")


def _export(loaded, path: Path, exporter: str = "torchscript") -> Path:
    result = export(loaded, path, exporter=exporter)
    return Path(getattr(result, "path", path))


def _variant_schema() -> dict:
    return report.schema()["properties"]["variants"]


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("opt_text")
    loaded = load_model(f"{MODELS}:TinyText", inputs=["input_ids:int64[batch,seq]"], dims=["seq=1..32"])
    model = _export(loaded, out / "model.onnx", "dynamo")  # TorchScript bakes the attention reshapes
    return out, optimize.variants(loaded, model, out, **FAST)


def test_every_variant_passes_or_says_why(text_run):
    out, result = text_run
    names = [v.name for v in result.variants]
    assert names[0] == optimize.BASELINE and set(optimize.VARIANTS) <= set(names)
    for v in result.variants:
        assert v.passed or v.reason, v
        if v.passed:
            assert v.path and (out / v.path).is_file()
            assert v.latency_ms.get("1") and v.metric is not None
    by = {v.name: v for v in result.variants}
    assert by["slim"].passed and by["ort"].passed and by["export"].passed
    assert by["ort"].details["level"] == "extended" and by["ort"].details["portable"]
    assert by["fused"].details.get("num_heads") == 2 or by["fused"].skipped
    assert by["int8"].metrics and all(m.name in ("cosine", "top1_agreement") for m in by["int8"].metrics)
    assert by["fp16"].tolerance == {"atol": 0.01, "rtol": 0.01}


def test_best_is_fastest_passing_and_copied(text_run):
    out, result = text_run
    assert result.best is not None and result.best.passed
    assert (out / "best.onnx").is_file()
    passing = [v for v in result.variants if v.passed]
    assert result.best.latency_ms["1"] <= min(v.latency_ms["1"] for v in passing) or result.best.name == "export"


def test_entries_fit_the_report_schema(text_run):
    _, result = text_run
    entries = result.to_list()
    jsonschema.validate(entries, _variant_schema())
    for e in entries:
        assert {"reason", "speedup", "build_seconds", "prove_seconds"} <= set(e)
        if e["metric"]:
            assert set(e["metric"]) == {"name", "value", "threshold", "passed"}


def test_fp16_overflow_is_rejected_and_not_chosen(tmp_path):
    src = tmp_path / "big.py"
    src.write_text(BIG_SCALE)
    loaded = load_model(f"{src}:BigScale", inputs=["x:float32[batch,8]"])
    model = _export(loaded, tmp_path / "model.onnx")
    result = optimize.variants(loaded, model, tmp_path, names=["fp16", "fused"], **FAST)
    by = {v.name: v for v in result.variants}
    assert not by["fp16"].passed and by["fp16"].reason
    assert by["fp16"].divergence is not None
    assert by["fused"].skipped and "not a transformer" in by["fused"].skipped
    assert result.best is not None and result.best.name == "export"


def test_unknown_variant_is_a_usage_error(tmp_path):
    loaded = load_model(f"{MODELS}:TinyMLP", inputs=["x:float32[batch,8]"])
    with pytest.raises(UsageError, match="unknown variant"):
        optimize.variants(loaded, tmp_path / "model.onnx", tmp_path, names=["turbo"])


def _v(name: str, ms: float | None, passed: bool = True, size: int = 100, skipped: str | None = None) -> Variant:
    return Variant(name, f"variants/{name}.onnx", passed, skipped=skipped, bytes=size,
                   latency_ms={} if ms is None else {"1": ms})


def test_select_best_on_synthetic_entries():
    entries = [_v("export", 10.0), _v("slim", 9.0), _v("int8", 4.0, passed=False), _v("fp16", 9.0, size=50),
               _v("fused", 2.0, skipped="not a transformer"), _v("ort", None)]
    assert select_best(entries).name == "fp16"  # fastest passing; tie at 9.0 broken by the smaller file
    assert select_best([_v("int8", 1.0, passed=False)]) is None
    assert select_best([]) is None
    as_dicts = [e.to_dict() for e in entries]
    assert select_best(as_dicts)["name"] == "fp16"
