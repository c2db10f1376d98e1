"""Unit tests for onnxport.report: the JSON Schema contract and report.md rendering."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from onnxport import report


def _minimal() -> dict:
    return {
        "onnxport_version": "0.1.0",
        "status": "export_failed",
        "model": {"source": "m.py:Net", "name": "Net", "parameters": 0},
        "export": None,
        "check": None,
        "validation": None,
        "variants": [],
        "benchmark": None,
        "diagnostics": [],
    }


def _ok_report() -> dict:
    return {
        "onnxport_version": "0.1.0",
        "status": "ok",
        "summary": "exported and proven on 2 cases",
        "model": {"source": "models.py:TinyMLP", "name": "TinyMLP", "parameters": 1234567, "kind": "python"},
        "export": {
            "exporter": "dynamo", "opset": 18, "seconds": 1.234, "path": "out/model.onnx", "external_data": False,
            "inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 16]}],
            "outputs": [{"name": "y", "dtype": "float32", "shape": ["batch", 4]}],
            "attempts": [{"exporter": "dynamo", "ok": True, "seconds": 1.2, "opset": 18, "error": None}],
        },
        "check": {
            "ok": True, "ir_version": 10, "opset": 18, "nodes": 3, "initializers": 2, "parameters": 1234567,
            "bytes": 4096, "op_histogram": {"Gemm": 2, "Relu": 1},
            "dynamic_dims": [{"input": "x", "axis": 0, "symbol": "batch", "proven": True, "symbolic": True,
                              "min": 1, "max": 64, "sizes_passed": [1, 2, 64]}],
        },
        "validation": {
            "passed": True,
            "tolerance": {"atol": 0.0001, "rtol": 0.001},
            "cases": [
                {"label": "export", "shapes": {"x": [2, 16]}, "max_abs_err": 1.5e-07, "max_rel_err": 2e-07,
                 "passed": True, "error": None},
                {"label": "max", "shapes": {"x": [64, 16]}, "max_abs_err": 0.0, "max_rel_err": 0.0,
                 "passed": True, "error": None},
            ],
            "divergence": None,
        },
        "variants": [],
        "benchmark": {"threads": 1, "runs": [{"backend": "onnxruntime", "batch": 1, "p50_ms": 0.1, "p90_ms": 0.2,
                                               "p99_ms": 0.3, "throughput": 1000.0}]},
        "diagnostics": [
            {"severity": "info", "code": "opset-chosen", "message": "opset 18 was used", "module": None,
             "node": None, "hint": None},
        ],
    }


def _failed_report() -> dict:
    r = _ok_report()
    r["status"] = "validation_failed"
    r["summary"] = "1 of 2 cases fail"
    r["validation"]["passed"] = False
    r["validation"]["cases"][1].update(max_abs_err=None, max_rel_err=None, passed=False,
                                       error="onnxruntime fails: Reshape node bad")
    r["validation"]["divergence"] = {"module": "net.fc1", "node": "/fc1/Gemm", "max_abs_err": 3.5}
    r["diagnostics"] = [
        {"severity": "error", "code": "parity-failed", "message": "1 of 2 validation cases fail",
         "module": "net.fc1", "node": "/fc1/Gemm", "hint": "try --exporter dynamo"},
        {"severity": "warning", "code": "tracer-warning", "message": "models.py:12: converting a tensor",
         "module": None, "node": None, "hint": None},
    ]
    return r


# --------------------------------------------------------------------------- schema


def test_schema_loads():
    s = report.schema()
    assert s["type"] == "object"
    assert s["properties"]["status"]["enum"] == ["ok", "validation_failed", "export_failed"]
    assert set(s["required"]) >= {"onnxport_version", "status", "model", "diagnostics"}
    jsonschema.Draft202012Validator.check_schema(s)
    assert report.schema() is s  # cached


def test_minimal_report_is_valid():
    report.validate(_minimal())


def test_full_reports_are_valid():
    report.validate(_ok_report())
    report.validate(_failed_report())


@pytest.mark.parametrize("key", ["onnxport_version", "status", "model", "export", "check", "validation",
                                 "variants", "benchmark", "diagnostics"])
def test_missing_required_key_fails(key):
    r = _minimal()
    del r[key]
    with pytest.raises(jsonschema.ValidationError) as excinfo:
        report.validate(r)
    assert key in excinfo.value.message


def test_missing_nested_required_key_fails():
    r = _ok_report()
    del r["model"]["parameters"]
    with pytest.raises(jsonschema.ValidationError):
        report.validate(r)
    r = _ok_report()
    del r["validation"]["cases"][0]["passed"]
    with pytest.raises(jsonschema.ValidationError):
        report.validate(r)


def test_unknown_status_fails():
    r = _minimal()
    r["status"] = "weird"
    with pytest.raises(jsonschema.ValidationError) as excinfo:
        report.validate(r)
    assert "weird" in excinfo.value.message


@pytest.mark.parametrize(
    ("path", "value"),
    [(("model", "parameters"), -1), (("diagnostics",), [{"severity": "fatal", "code": "x", "message": "m",
                                                         "module": None, "node": None, "hint": None}]),
     (("check", "nodes"), "3"), (("validation", "cases"), [{"shapes": {"x": [2.5]}, "max_abs_err": 0.0,
                                                            "max_rel_err": 0.0, "passed": True}])],
)
def test_wrong_types_fail(path, value):
    r = _ok_report()
    target = r
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        report.validate(r)


def test_write_all_and_load(tmp_path):
    r = _failed_report()
    paths = report.write_all(r, tmp_path)
    assert [p.name for p in paths] == ["report.json", "report.md", "report.html"]
    assert report.load(tmp_path) == r
    assert json.loads((tmp_path / "report.json").read_text()) == r
    assert (tmp_path / "report.md").read_text(encoding="utf-8") == report.render_markdown(r)
    assert not list(tmp_path.glob(".*.tmp"))


# --------------------------------------------------------------------------- markdown


def test_render_markdown_ok():
    md = report.render_markdown(_ok_report())
    lines = md.splitlines()
    assert lines[0] == "## onnxport: ✅ ok"
    assert "exported and proven on 2 cases" in lines
    assert "**Model** `models.py:TinyMLP` (TinyMLP, 1,234,567 parameters)" in lines
    assert "**Export** dynamo exporter, opset 18, 1.2 s" in lines
    assert "| input | `x` | float32 | ['batch', 16] |" in lines
    assert "| output | `y` | float32 | ['batch', 4] |" in lines
    assert "**Validation** passed (atol 0.0001, rtol 0.001)" in lines
    assert "| case | shapes | max abs err | pass |" in lines
    assert "| export | x[2, 16] | 1.50e-07 | ✅ |" in lines
    assert "| max | x[64, 16] | 0.00e+00 | ✅ |" in lines
    assert "**Diagnostics**" in lines
    assert "- **info** `opset-chosen`: opset 18 was used" in lines
    assert md.endswith("\n")


def test_render_markdown_failed():
    md = report.render_markdown(_failed_report())
    lines = md.splitlines()
    assert lines[0] == "## onnxport: ❌ validation_failed"
    assert "**Validation** failed (atol 0.0001, rtol 0.001)" in lines
    assert "| export | x[2, 16] | 1.50e-07 | ✅ |" in lines
    assert "| max | x[64, 16] | – | ❌ onnxruntime fails: Reshape node bad |" in lines
    assert ("- **error** `parity-failed` (net.fc1): 1 of 2 validation cases fail — try --exporter dynamo"
            in lines)
    assert "- **warning** `tracer-warning`: models.py:12: converting a tensor" in lines


def test_render_markdown_export_failed_minimal():
    r = _minimal()
    r["diagnostics"] = [{"severity": "error", "code": "export-failed", "message": "no exporter could export",
                         "module": None, "node": None, "hint": "try --exporter torchscript"}]
    md = report.render_markdown(r)
    lines = md.splitlines()
    assert lines[0] == "## onnxport: ⛔ export_failed"
    assert "**Model** `m.py:Net` (Net, 0 parameters)" in lines
    assert not any(line.startswith("**Export**") for line in lines)
    assert not any(line.startswith("**Validation**") for line in lines)
    assert "| case | shapes | max abs err | pass |" not in lines
    assert "- **error** `export-failed`: no exporter could export — try --exporter torchscript" in lines


def test_render_markdown_without_diagnostics_has_no_section():
    r = copy.deepcopy(_ok_report())
    r["diagnostics"] = []
    assert "**Diagnostics**" not in report.render_markdown(r)


def test_branch_coverage_and_frozen_attempts_render():
    from onnxport.report.html import render_html

    r = _ok_report()
    r["export"]["attempts"] = [
        {"exporter": "dynamo", "ok": True, "seconds": 1.0, "opset": 23, "error": None,
         "frozen": "torch.export assumed seq in 9..32 (declared 1..32)"},
        {"exporter": "cond", "ok": True, "seconds": 1.0, "opset": 23, "error": None,
         "note": "the `if` at m.py:3 was exported as torch.cond"}]
    r["validation"]["branches"] = [
        {"node": "node_cond__0", "op": "If", "module": "gate", "covered": True,
         "sides": {"true": "export", "false": "branch: values x-10 at export sizes"}},
        {"node": "/model/Loop", "op": "Loop", "module": "", "covered": False, "trip_counts": {"16": "export"}}]
    report.validate(r)
    md = report.render_markdown(r)
    assert "| If `node_cond__0` | gate | true: export, false: branch: values x-10 at export sizes | ✅ |" in md
    assert "| Loop `/model/Loop` | – | 16: export | ⚠️ |" in md
    html = render_html(r)
    assert "Control flow exercised" in html and "16 iterations: export" in html
    assert "torch.export assumed seq in 9..32" in html and "exported as torch.cond" in html


def test_the_summary_says_which_sizes_each_dim_was_proven_at():
    """A model wrong at batch 7 alone passes at 1, 2, 9 and 64: the summary claims those sizes, no range."""
    from onnxport.report.build import proven_sizes

    dims = [{"input": "x", "axis": 0, "symbol": "batch"}, {"input": "x", "axis": 1, "symbol": "seq"},
            {"input": "mask", "axis": 0, "symbol": "batch", "sizes_passed": [5]}]
    cases = [{"passed": True, "shapes": {"x": [2, 16]}}, {"passed": True, "shapes": {"x": [1, 1]}},
             {"passed": True, "shapes": {"x": [64, 2]}}, {"passed": True, "shapes": {"x": [9, 3]}},
             {"passed": False, "shapes": {"x": [7, 4]}}]
    assert proven_sizes(dims, cases) == "; batch proven at 1, 2, 5, 9, 64; seq at 1-3, 16"
    assert proven_sizes([], cases) == ""
