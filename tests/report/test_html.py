"""report.html: rendering without a browser, then each page opened in Debian's Chromium through Playwright.

The browser tests need /usr/bin/chromium (``apt-get install chromium``, or ``bash scripts/ensure-chromium.sh``)
and the ``playwright`` package (the dev extra); without chromium they fail, unless ONNXPORT_SKIP_BROWSER=1 is set
(then they are skipped). Screenshots land in test-artifacts/.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

from onnxport import api, report
from onnxport.report import html as report_html
from tests.conftest import ARTIFACTS, MODELS, ROOT

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1280, "height": 800}
EVIL = "<script>alert(1)</script>"
PLOTLY_BANNER = re.compile(r"plotly\.js v\d+\.\d+\.\d+")


def _load_benchmark_module():
    spec = importlib.util.spec_from_file_location("report_size", ROOT / "benchmarks" / "report_size.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


synthetic_report = _load_benchmark_module().synthetic_report


def _export_failed_report() -> dict:
    return {
        "onnxport_version": "0.1.0", "status": "export_failed",
        "summary": "Export failed: UnsupportedOperatorError: aten::linalg_eigvals is not supported.",
        "command": None,
        "model": {"source": "eig.py:Eig", "name": "Eig", "parameters": 0},
        "export": {"exporter": None, "opset": None, "seconds": 0.5, "path": None, "external_data": False,
                   "inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 4, 4]}],
                   "outputs": [{"name": "output", "dtype": "unknown", "shape": None}],
                   "attempts": [{"exporter": "dynamo", "ok": False, "seconds": 0.4, "error": "DispatchError: eig"},
                                {"exporter": "torchscript", "ok": False, "seconds": 0.1,
                                 "error": "UnsupportedOperatorError: aten::linalg_eigvals"}]},
        "check": None, "validation": None, "variants": [], "benchmark": None,
        "diagnostics": [{"severity": "error", "code": "export-failed", "message": "no exporter could export the model",
                         "module": None, "node": None, "hint": "try --exporter torchscript or another --opset"}],
    }


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """Two real pipeline runs (TorchScript exporter: < 2 s each): one proven, one failing validation."""
    root = tmp_path_factory.mktemp("html")
    ok = api.export(f"{MODELS}:TinyMLP", root / "ok", inputs=["x:float32[batch,8]"], exporter="torchscript",
                    command="onnxport export TinyMLP")
    failed = api.export(f"{MODELS}:NeedsItem", root / "failed", inputs=["x:float32[batch,4]"], exporter="torchscript")
    assert ok["status"] == "ok" and failed["status"] == "validation_failed"
    return {"ok": (root / "ok", ok), "failed": (root / "failed", failed)}


# --------------------------------------------------------------------------- without a browser


def test_pipeline_writes_the_page_from_the_report(exported):
    out, rep = exported["ok"]
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page == report.render_html(report.load(out))
    assert page.startswith("<!DOCTYPE html>")
    assert 'data-status="ok"' in page
    assert f'<p class="sentence" id="summary">{rep["summary"]}</p>' in page
    assert rep["summary"].startswith("Proven: the ONNX model matches PyTorch on")
    assert '<pre id="command">onnxport export TinyMLP</pre>' in page
    assert "onnxport view model.onnx" in page


def test_page_is_self_contained(exported):
    page = (exported["ok"][0] / "report.html").read_text(encoding="utf-8")
    assert len(set(PLOTLY_BANNER.findall(page))) == 1
    assert page.count("<script src") == 0 and "<link" not in page and "@import" not in page
    own = page.replace(report_html.assets()[1], "")  # the page without the inline plotly.js
    assert len(own) < 60_000 and not PLOTLY_BANNER.search(own)
    assert "http://" not in own and "https://" not in own  # no URL at all outside plotly's own defaults
    assert page.count('id="chart-ops"') == 1 and page.count('id="chart-errors"') == 1
    assert "chart-latency" not in page and "chart-speedup" not in page  # no benchmark yet
    assert re.search(r'<section id="benchmark">.*?Not run\.', page, re.S)
    assert re.search(r'<section id="variants">.*?Not run\.', page, re.S)


def test_failed_page_names_failing_case_and_hint(exported):
    out, rep = exported["failed"]
    page = (out / "report.html").read_text(encoding="utf-8")
    assert 'data-status="validation_failed"' in page and ">Validation failed</h1>" in page
    failing = [c for c in rep["validation"]["cases"] if not c["passed"]]
    assert [c["label"] for c in failing] == ["max", "odd"]
    for c in failing:
        assert f'<tr class="bad" data-case="{c["label"]}">' in page
        assert f'<span class="casefail">{c["error"]}</span>' in page
    hint = next(d["hint"] for d in rep["diagnostics"] if d["code"] == "parity-failed")
    assert f"<b>hint</b> {hint.replace(chr(39), '&#39;')}</p>" in page
    assert "onnxport view model.unverified.onnx" in page


def test_export_failed_report_renders_without_charts():
    rep = _export_failed_report()
    report.validate(rep)
    page = report.render_html(rep)
    assert 'data-status="export_failed"' in page and ">Export failed</h1>" in page
    assert "Export failed: UnsupportedOperatorError: aten::linalg_eigvals is not supported." in page
    assert "Not run: the export failed, so there is no ONNX model to validate." in page
    assert page.count("Not checked (no ONNX model).") == 2
    assert "No ONNX model was produced." in page
    assert "The command was not recorded" in page
    assert page.count('<tr class="bad">') == 2  # both attempts
    assert "UnsupportedOperatorError: aten::linalg_eigvals</pre>" in page
    assert not PLOTLY_BANNER.search(page) and len(page) < 40_000  # no plotly.js when there is no chart


def test_minimal_report_renders():
    rep = {"onnxport_version": "0.1.0", "status": "export_failed", "model": {"source": "m.py:Net", "name": "Net",
           "parameters": 0}, "export": None, "check": None, "validation": None, "variants": [], "benchmark": None,
           "diagnostics": []}
    page = report.render_html(rep)
    assert ">Export failed</h1>" in page and "No diagnostics." in page and "No export attempt recorded." in page


def test_report_text_is_escaped_everywhere():
    rep = synthetic_report(nodes=200, cases=5)
    rep["diagnostics"][0]["message"] = EVIL
    rep["diagnostics"][0]["hint"] = EVIL
    rep["validation"]["cases"][0]["label"] = EVIL  # also lands in the chart's JSON
    rep["check"]["op_histogram"][EVIL] = 10_000
    rep["model"]["source"] = EVIL
    rep["summary"] = EVIL
    page = report.render_html(rep)
    assert EVIL not in page
    assert "alert(1)" in page  # the text is there, only made harmless
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 6
    assert "\\u003cscript\\u003ealert(1)\\u003c\\u002fscript\\u003e" in page  # plotly's escaped JSON


def test_histogram_keeps_top_30_plus_other():
    rep = synthetic_report(nodes=5000, cases=100)
    hist = rep["check"]["op_histogram"]
    rows = report_html.top_ops(hist)
    assert len(rows) == 31
    assert sum(n for _, n in rows) == 5000 == sum(hist.values())
    assert rows[-1] == (f"other ({len(hist) - 30} op types)", sum(sorted(hist.values())[: len(hist) - 30]))
    assert [n for _, n in rows[:30]] == sorted(hist.values(), reverse=True)[:30]
    assert report_html.top_ops({"Add": 2, "Mul": 3}) == [("Mul", 3), ("Add", 2)]


def test_large_report_collapses_long_tables():
    rep = synthetic_report(nodes=5000, cases=100)
    report.validate(rep)
    page = report.render_html(rep)
    failing = [c for c in rep["validation"]["cases"] if not c["passed"]]
    assert len(failing) == 5
    assert f'<h3 id="failing-cases">Failing cases ({len(failing)})</h3>' in page
    assert "<details><summary>all 100 cases</summary>" in page
    assert page.count('data-case="case ') == 100 + len(failing)  # full table (collapsed) + failing table
    assert "Op types (top 30 of " in page
    assert "<summary>25 more diagnostics</summary>" in page  # 1 error + 5 warnings shown, 25 collapsed
    assert "<summary>all 18 runs</summary>" in page and "<details open>" not in page
    own = len(page.encode()) - len(report_html.assets()[1].encode())
    assert own < 250_000, f"page without plotly.js is {own} bytes"


def test_long_verdict_is_shortened_in_the_banner():
    rep = _export_failed_report()
    rep["summary"] = "Export failed: " + "x" * 1000 + "."
    page = report.render_html(rep)
    assert f'id="summary">Export failed: {"x" * (report_html.VERDICT_CHARS - 15)}…</p>' in page
    assert f"<summary>full verdict</summary><pre>{rep['summary']}</pre>" in page


def test_speedup_needs_a_pytorch_baseline():
    rep = synthetic_report(nodes=100, cases=3)
    rep["benchmark"]["runs"] = [r for r in rep["benchmark"]["runs"] if not r["backend"].startswith("pytorch")]
    page = report.render_html(rep)
    assert 'id="chart-latency"' in page and "chart-speedup" not in page
    assert "No PyTorch backend among the runs: no speedup to show." in page
    assert report_html.baseline_backend(["onnxruntime", "torch-compile", "pytorch-eager"]) == "pytorch-eager"
    assert report_html.baseline_backend(["onnxruntime", "torch-compile"]) == "torch-compile"


def test_write_all_writes_html_atomically(tmp_path):
    rep = synthetic_report(nodes=50, cases=3)
    paths = report.write_all(rep, tmp_path)
    assert [p.name for p in paths] == ["report.json", "report.md", "report.html"]
    assert (tmp_path / "report.html").read_text(encoding="utf-8") == report.render_html(rep)
    assert not list(tmp_path.glob(".*.tmp"))


# --------------------------------------------------------------------------- in Chromium


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        if os.environ.get("ONNXPORT_SKIP_BROWSER") == "1":
            pytest.skip("ONNXPORT_SKIP_BROWSER=1 and no Debian chromium at /usr/bin/chromium")
        pytest.fail("browser tests need Debian's chromium at /usr/bin/chromium (bash scripts/ensure-chromium.sh "
                    "installs it); set ONNXPORT_SKIP_BROWSER=1 to skip them", pytrace=False)
    from playwright import sync_api
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def pages(exported, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pages")
    files = {"ok": exported["ok"][0] / "report.html", "failed": exported["failed"][0] / "report.html"}
    for name, rep in (("synthetic", synthetic_report(nodes=5000, cases=100)), ("export_failed", _export_failed_report())):
        files[name] = root / f"{name}.html"
        files[name].write_text(report.render_html(rep), encoding="utf-8")
    return files


def _open(browser, path: Path, name: str | None = None):
    """Open ``path``; return (page, console errors, page errors, requested URLs); screenshots when ``name``."""
    page = browser.new_page(viewport=VIEWPORT)
    console, errors, requests = [], [], []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_function("Array.from(document.querySelectorAll('.plotly-graph-div'))"
                           ".every(el => el.classList.contains('js-plotly-plot'))", timeout=10_000)
    if name:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"report-{name}.png"))
        page.screenshot(path=str(ARTIFACTS / f"report-{name}-full.png"), full_page=True)
    return page, console, errors, requests


CHART_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(el => ({
    id: el.id,
    traces: el.data.map(t => ({name: t.name || '', n: (t.x || []).length, ny: (t.y || []).length})),
    drawn: el.querySelectorAll('.scatterlayer .point, .barlayer .point').length}))"""

EXPECTED_CHARTS = {"ok": ["chart-ops", "chart-errors"], "failed": ["chart-ops", "chart-errors"],
                   "synthetic": ["chart-ops", "chart-errors", "chart-latency", "chart-speedup"], "export_failed": []}


@pytest.mark.parametrize("name", list(EXPECTED_CHARTS))
def test_page_in_chromium(browser, pages, name):
    page, console, errors, requests = _open(browser, pages[name], name)
    try:
        assert console == [] and errors == []
        assert requests[0] == pages[name].as_uri()
        leaving = [u for u in requests[1:] if not u.startswith(("data:", "blob:"))]
        assert leaving == [], f"requests leaving the page: {leaving}"
        verdict = page.locator("#verdict")
        assert verdict.is_visible()
        box = verdict.bounding_box()
        assert box["y"] >= 0 and box["y"] + box["height"] <= VIEWPORT["height"], box
        assert page.locator("#verdict").get_attribute("data-status") == (
            {"ok": "ok", "export_failed": "export_failed"}.get(name, "validation_failed"))
        charts = page.evaluate(CHART_JS)
        assert [c["id"] for c in charts] == EXPECTED_CHARTS[name]
        for c in charts:
            assert c["traces"], c
            assert all(t["n"] > 0 and t["n"] == t["ny"] for t in c["traces"]), c
            assert c["drawn"] == sum(t["n"] for t in c["traces"]), c  # every point/bar made it into the SVG
    finally:
        page.close()


def test_chart_values_in_chromium(browser, pages, exported):
    page, *_ = _open(browser, pages["failed"])
    try:
        charts = {c["id"]: c for c in page.evaluate(CHART_JS)}
        rep = exported["failed"][1]
        assert charts["chart-errors"]["traces"] == [{"name": "passed", "n": 3, "ny": 3}, {"name": "failed", "n": 2, "ny": 2}]
        assert page.evaluate("document.getElementById('chart-ops').data[0].y") == ["Gemm", "Neg"]
        failing_row = page.locator('tr[data-case="max"]')
        assert failing_row.is_visible()
        assert "output: max abs error 3.36" in failing_row.inner_text()
        hint = next(d["hint"] for d in rep["diagnostics"] if d["code"] == "parity-failed")
        assert page.locator("#diagnostics .hint", has_text=hint).is_visible()
    finally:
        page.close()
    page, *_ = _open(browser, pages["synthetic"])
    try:
        ops_y = page.evaluate("document.getElementById('chart-ops').data[0].y")
        assert len(ops_y) == 31 and ops_y[-1].startswith("other (")
        speed = page.evaluate("document.getElementById('chart-speedup').data.map(t => [t.name, t.y.map(y => +y.toFixed(2))])")
        assert speed == [["onnxruntime", [1.5] * 6], ["onnxruntime-int8", [2.4] * 6]]
        assert page.evaluate("document.getElementById('chart-errors').layout.yaxis.type") == "log"
        assert not page.locator('tr[data-case="case 0"]').first.is_visible()  # the full table is collapsed
        assert page.locator('#failing-cases + .tablewrap tr[data-case="case 5"]').is_visible()
    finally:
        page.close()


def test_variants_table_reads_as_words():
    """A variant's metric, its latencies per batch and a skipped variant are written out, not as raw dicts."""
    rep = _export_failed_report()
    rep["variants"] = [
        {"name": "export", "path": "model.onnx", "passed": True, "max_abs_err": 3.6e-7,
         "metric": {"name": "cosine", "value": 1.0, "threshold": 0.99, "passed": True},
         "latency_ms": {"1": 0.7086, "8": 7.119}},
        {"name": "int8", "path": "variants/int8.onnx", "passed": False, "max_abs_err": 3.4e-2,
         "metric": {"name": "top1_agreement", "value": 0.92, "threshold": 0.95, "passed": False},
         "latency_ms": {"1": 0.5748}},
        {"name": "fp16", "passed": False, "skipped": "not built by default: no fp16 arithmetic", "latency_ms": {}},
    ]
    page = report.render_html(rep)
    table = page[page.index('<table class="variants">'):]
    table = html_text(table[:table.index("</table>")])
    assert "cosine 1 (≥ 0.99)" in table and "1: 0.709 · 8: 7.12" in table
    assert "top1 agreement 0.92 (≥ 0.95)" in table and "fail" in table
    assert "fp16 – – – skipped" in table
    assert "{" not in table and "'" not in table


def html_text(fragment: str) -> str:
    import html

    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", fragment))).strip()


def test_a_variant_shows_its_centred_metric_and_what_cannot_tell():
    from onnxport.report.html import _variant_centred

    assert _variant_centred({"name": "int8"}) is None
    note = _variant_centred({"varying": {"cosine_centred": 0.8375, "top1_centred": None,
                                         "cannot_tell": {"top-1 (raw)": "PyTorch predicts one class for all 26 rows"}}})
    assert note.startswith("centred: cosine 0.8375") and "top-1 (raw) cannot tell (PyTorch predicts one class" in note
