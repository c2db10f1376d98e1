"""report.html: one self-contained page (inline CSS and plotly.js, no network) rendered from report.json.

``render_html`` turns the report dict into a small view model (every optional key defaulted, so older or
partial reports render), builds the plotly figures and fills the jinja2 template. Text from the report is
HTML-escaped by jinja2's autoescape; figure data is serialised by plotly, which escapes ``<``, ``>`` and
``/`` inside its JSON.
"""

from __future__ import annotations

import functools
import math
from importlib import resources
from typing import Any

__all__ = ["render_html", "TOP_OPS", "OPEN_ROWS"]

TOP_OPS = 30  # op histogram chart: the most frequent op types, the rest folded into "other"
OPEN_ROWS = 20  # tables longer than this are collapsed into <details>
VERDICT_CHARS = 280  # the verdict banner shows at most this much of the summary (full text below it)

_OK, _FAIL, _GREY = "#1a7f37", "#cf222e", "#8c959f"
_PALETTE = ["#0969da", "#bf8700", "#8250df", "#1a7f37", "#cf222e", "#1b7c83", "#bc4c00", "#57606a"]
_STATUS = {
    "ok": ("Proven", "ok"),
    "validation_failed": ("Validation failed", "fail"),
    "export_failed": ("Export failed", "fail"),
}


# --------------------------------------------------------------------------- formatting (jinja filters)


def _fmt_err(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return f"{x:.2e}" if isinstance(x, (int, float)) else str(x)


def _fmt_int(x: Any) -> str:
    return f"{x:,}" if isinstance(x, int) and not isinstance(x, bool) else ("–" if x is None else str(x))


def _fmt_bytes(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "–"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def _fmt_num(x: Any, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:,.0f}"
    return str(x)


def _fmt_shape(shape: Any) -> str:
    if shape is None:
        return "unknown"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _fmt_shapes(shapes: dict | None) -> str:
    return ", ".join(f"{k}{_fmt_shape(v)}" for k, v in (shapes or {}).items())


def _fmt_sizes(sizes: dict | None) -> str:
    return " ".join(f"{k}={v}" for k, v in (sizes or {}).items())


def _fmt_metric(m: Any) -> str:
    """A variant's deciding metric ``{"name", "value", "threshold", ...}`` as "cosine 0.9998 (≥ 0.99)"."""
    if isinstance(m, dict) and "name" in m:
        bound = f" (≥ {_fmt_num(m['threshold'], 4)})" if m.get("threshold") is not None else ""
        return f"{str(m['name']).replace('_', ' ')} {_fmt_num(m.get('value'), 4)}{bound}"
    if isinstance(m, dict):
        return ", ".join(f"{k} {_fmt_num(v, 4)}" for k, v in m.items())
    return _fmt_num(m, 4)


def _fmt_latencies(lat: Any) -> str:
    """Latency per bench size ``{"1": 0.71, "8": 7.1}`` as "1: 0.71 · 8: 7.12" ("–" when none was timed)."""
    if isinstance(lat, dict):
        return " · ".join(f"{k}: {_fmt_num(v)}" for k, v in lat.items()) or "–"
    return _fmt_num(lat)


# --------------------------------------------------------------------------- figures


_CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["select2d", "lasso2d"]}


_AXIS = {"gridcolor": "#eaeef2", "linecolor": "#d1d9e0", "zeroline": False, "ticks": "", "automargin": True,
         "title": {"standoff": 8}}


def _layout(**kw: Any) -> dict:
    # a few explicit styles instead of plotly's named templates: resolving "plotly_white" costs ~0.8 s per process
    base = {
        "template": None, "plot_bgcolor": "white", "paper_bgcolor": "white", "colorway": _PALETTE,
        "hoverlabel": {"font": {"family": "system-ui, sans-serif"}},
        "xaxis": dict(_AXIS), "yaxis": dict(_AXIS),
        "font": {"family": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", "size": 13},
        "margin": {"l": 60, "r": 20, "t": 40, "b": 50},
        "height": 360,
        "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0},
    }
    base.update(kw)
    return base


def _div(fig: Any, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=_CONFIG)


def top_ops(histogram: dict[str, int], top: int = TOP_OPS) -> list[tuple[str, int]]:
    """The ``top`` most frequent op types (ties by name) plus ("other (k op types)", sum) for the rest."""
    items = sorted(histogram.items(), key=lambda kv: (-kv[1], kv[0]))
    head, rest = items[:top], items[top:]
    if rest:
        head.append((f"other ({len(rest)} op types)", sum(v for _, v in rest)))
    return head


def _ops_figure(histogram: dict[str, int]) -> str:
    import plotly.graph_objects as go

    rows = top_ops(histogram)
    names, counts = [r[0] for r in rows], [r[1] for r in rows]
    colors = [_GREY if n.startswith("other (") else _PALETTE[0] for n in names]
    fig = go.Figure(go.Bar(x=counts, y=names, orientation="h", marker_color=colors, text=counts,
                           textposition="outside", cliponaxis=False,
                           hovertemplate="%{y}: %{x} nodes<extra></extra>"))
    fig.update_layout(**_layout(height=max(150, 60 + 22 * len(rows)), margin={"l": 10, "r": 40, "t": 10, "b": 40},
                                showlegend=False))
    fig.update_yaxes(autorange="reversed", automargin=True)
    fig.update_xaxes(title_text="nodes")
    return _div(fig, "chart-ops")


def _errors_figure(cases: list[dict], atol: float | None) -> str:
    """Max abs error per case on a log axis; exact zeros sit on a floor, cases that did not run on top."""
    import plotly.graph_objects as go

    errs = [c["max_abs_err"] for c in cases]
    finite = [e for e in errs if isinstance(e, (int, float)) and math.isfinite(e)]
    positive = [e for e in finite if e > 0] + ([atol] if atol else [])
    floor = min(positive) / 100 if positive else 1e-12
    ceiling = max(finite + positive + [floor]) * 10
    many = len(cases) > OPEN_ROWS
    groups: dict[str, dict[str, list]] = {}
    for i, c in enumerate(cases, 1):
        e = c["max_abs_err"]
        ran = isinstance(e, (int, float)) and math.isfinite(e)
        key = "did not run / no error value" if not ran else ("passed" if c["passed"] else "failed")
        g = groups.setdefault(key, {"x": [], "y": [], "text": []})
        g["x"].append(i)
        g["y"].append((e if e > 0 else floor) if ran else ceiling)
        shown = _fmt_err(e) if ran else (c.get("error") or "no value")
        g["text"].append(f"#{i} {c['label']}<br>{c['shapes_text']}<br>max abs err {shown}")
    style = {"passed": (_OK, "circle"), "failed": (_FAIL, "diamond"),
             "did not run / no error value": (_FAIL, "x")}
    fig = go.Figure()
    for key in ("passed", "failed", "did not run / no error value"):
        if key not in groups:
            continue
        g = groups[key]
        color, symbol = style[key]
        fig.add_trace(go.Scatter(x=g["x"], y=g["y"], mode="markers", name=key, text=g["text"],
                                 hovertemplate="%{text}<extra></extra>",
                                 marker={"color": color, "symbol": symbol, "size": 9 if many else 12,
                                         "line": {"width": 1, "color": "white"}}))
    if atol:
        fig.add_hline(y=atol, line_dash="dash", line_color="#57606a")
        # annotations on a log axis take log10(y) (add_hline's own annotation gets this wrong)
        fig.add_annotation(x=0, xref="paper", y=math.log10(atol), yref="y", text=f"atol {atol:g}",
                           showarrow=False, xanchor="left", yanchor="bottom", font={"color": "#57606a"})
    top = max(finite + positive + [floor]) * (10 if "did not run / no error value" in groups else 1)
    fig.update_yaxes(type="log", title_text="max abs error", exponentformat="e",
                     range=[math.log10(floor) - 0.4, math.log10(top) + 0.6])
    if many:
        fig.update_xaxes(title_text="case #")
    else:
        fig.update_xaxes(tickvals=list(range(1, len(cases) + 1)),
                         ticktext=[c["label"] or f"#{i}" for i, c in enumerate(cases, 1)])
    fig.update_layout(**_layout())
    return _div(fig, "chart-errors")


def _samples_figure(errors: list, failing: list[int], atol: float | None) -> str:
    """Histogram of the per-sample max abs error on log10 bins (passing and failing samples stacked); exact
    zeros fall in the lowest bin, the dashed line is atol."""
    import plotly.graph_objects as go

    finite = [(i, e) for i, e in enumerate(errors) if isinstance(e, (int, float)) and math.isfinite(e)]
    positive = [e for _, e in finite if e > 0] + ([atol] if atol else [])
    floor = min(positive) / 10 if positive else 1e-12
    logs = {i: math.log10(e if e > 0 else floor) for i, e in finite}
    lo, hi = math.floor(min(logs.values(), default=-12)), math.ceil(max([*logs.values(), math.log10(floor)]) + 1e-9)
    hi = max(hi, lo + 1, math.ceil(math.log10(atol)) + 1 if atol else hi)
    bins = {"start": lo, "end": hi, "size": (hi - lo) / min(40, max(8, 4 * (hi - lo)))}
    bad = set(failing)
    fig = go.Figure()
    for name, color, keep in (("passed", _OK, lambda i: i not in bad), ("failed", _FAIL, lambda i: i in bad)):
        xs = [x for i, x in logs.items() if keep(i)]
        if xs:
            fig.add_trace(go.Histogram(x=xs, xbins=bins, name=f"{name} ({len(xs)})", marker_color=color,
                                       hovertemplate="10^%{x}: %{y} sample(s)<extra></extra>"))
    if atol:
        fig.add_vline(x=math.log10(atol), line_dash="dash", line_color="#57606a")
        fig.add_annotation(x=math.log10(atol), y=1, yref="paper", text=f"atol {atol:g}", showarrow=False,
                           xanchor="left", yanchor="top", font={"color": "#57606a"})
    decades = list(range(lo, hi + 1))
    fig.update_xaxes(title_text="max abs error of the sample (log scale)", tickvals=decades,
                     ticktext=[f"1e{k}" for k in decades], range=[lo - 0.2, hi + 0.2])
    fig.update_yaxes(title_text="samples", rangemode="tozero", **({"dtick": 1} if len(errors) <= 12 else {}))
    fig.update_layout(**_layout(barmode="stack", bargap=0.05))
    return _div(fig, "chart-samples")


def _samples_view(samples: dict | None) -> dict | None:
    """The ``validation.samples`` section with defaults and its metrics as (label, value) rows."""
    if not samples:
        return None
    m = samples.get("metrics") or {}
    rows = [(label, m[key]) for key, label in (("top1_agreement", "top-1 agreement"),
                                                ("topk_agreement", f"top-{m.get('k', 5)} agreement"),
                                                ("cosine_min", "cosine, lowest sample"),
                                                ("cosine_mean", "cosine, mean")) if m.get(key) is not None]
    how = samples.get("transform") or (f"tokenizer {samples['tokenizer']}" if samples.get("tokenizer") else "")
    return dict({"file": "?", "kind": "?", "count": 0, "failed": 0, "failures": [], "batch_size": None,
                 "passed": False, "max_abs_err": None}, **samples, metric_rows=rows, how=how,
                task=m.get("task"))


def _variant_samples(x: dict) -> str | None:
    """One variant's result on the samples: its metrics, or how many samples fail."""
    s = x.get("samples")
    if not s:
        return None
    parts = [f"{m['name']} {_fmt_num(m['value'], 4)}" for m in s.get("metrics") or [] if m.get("value") is not None]
    if s.get("failed") and not s.get("metric_decides"):  # elementwise policies: samples outside the tolerance
        parts.append(f"{s['failed']} sample(s) off")
    return " · ".join(parts) or ("pass" if s.get("passed") else "fail")


def _variant_centred(x: dict) -> str | None:
    """One variant's task metric on what varies between the inputs (``varying``), and what cannot tell, in words."""
    v = x.get("varying")
    if not v:
        return None
    parts = [f"{label} {_fmt_num(v[key], 4)}" for key, label in (("cosine_centred", "cosine"), ("top1_centred", "top-1"))
             if v.get(key) is not None]
    told = f"centred: {', '.join(parts)}" if parts else ""
    untold = "; ".join(f"{k} cannot tell ({why})" for k, why in (v.get("cannot_tell") or {}).items())
    return " · ".join(p for p in (told, untold) if p) or None


def _variants_view(entries: list[dict]) -> list[dict]:
    """``variants[]`` with every key the table reads, the result on the samples and the centred metric in words."""
    return [dict({"name": "?", "path": None, "nodes": None, "bytes": None, "passed": False, "max_abs_err": None,
                  "metric": None, "latency_ms": None, "skipped": None, "skip_reason": None}, **x,
                 on_samples=_variant_samples(x), centred=_variant_centred(x)) for x in entries]


def baseline_backend(backends: list[str]) -> str | None:
    """The backend speedups are measured against: PyTorch eager where it ran, else another PyTorch backend."""
    torch = [b for b in backends if "torch" in b.lower() and "onnx" not in b.lower()]
    eager = [b for b in torch if "eager" in b.lower()]
    return (eager or torch or [None])[0]


def _bench_figures(runs: list[dict]) -> tuple[str, str | None, str | None]:
    import plotly.graph_objects as go

    backends = list(dict.fromkeys(r["backend"] for r in runs))
    by_backend = {b: sorted((r for r in runs if r["backend"] == b), key=lambda r: r["batch"]) for b in backends}
    batches = sorted({r["batch"] for r in runs})
    lat = go.Figure()
    for i, b in enumerate(backends):
        rs = by_backend[b]
        lat.add_trace(go.Scatter(
            x=[r["batch"] for r in rs], y=[r["p50_ms"] for r in rs], name=b, mode="lines+markers",
            line={"color": _PALETTE[i % len(_PALETTE)]},
            error_y={"type": "data", "symmetric": False, "array": [r["p99_ms"] - r["p50_ms"] for r in rs],
                     "arrayminus": [0] * len(rs), "thickness": 1},
            customdata=[[r["p90_ms"], r["p99_ms"], r["throughput"]] for r in rs],
            hovertemplate=(f"{b}<br>batch %{{x}}<br>p50 %{{y:.3g}} ms<br>p90 %{{customdata[0]:.3g}} ms"
                           "<br>p99 %{customdata[1]:.3g} ms<br>%{customdata[2]:.4g} items/s<extra></extra>")))
    lat.update_xaxes(title_text="batch", type="log" if len(batches) > 2 and batches[0] > 0 else "linear",
                     tickvals=batches)
    lat.update_yaxes(title_text="latency p50 (ms), bar to p99", rangemode="tozero")
    lat.update_layout(**_layout())
    latency = _div(lat, "chart-latency")

    base = baseline_backend(backends)
    if base is None:
        return latency, None, None
    base_p50 = {r["batch"]: r["p50_ms"] for r in by_backend[base]}
    sp = go.Figure()
    for i, b in enumerate(backends):
        if b == base:
            continue
        rs = [r for r in by_backend[b] if base_p50.get(r["batch"]) and r["p50_ms"]]
        if not rs:
            continue
        ys = [base_p50[r["batch"]] / r["p50_ms"] for r in rs]
        sp.add_trace(go.Bar(x=[str(r["batch"]) for r in rs], y=ys, name=b,
                            marker_color=_PALETTE[i % len(_PALETTE)], text=[f"{y:.2f}×" for y in ys],
                            textposition="outside", cliponaxis=False,
                            hovertemplate=f"{b}<br>batch %{{x}}: %{{y:.2f}}× {base}<extra></extra>"))
    if not sp.data:
        return latency, None, base
    sp.add_hline(y=1.0, line_dash="dash", line_color="#57606a")
    sp.update_xaxes(title_text="batch", type="category")
    sp.update_yaxes(title_text=f"speedup over {base} (p50)", rangemode="tozero")
    sp.update_layout(**_layout(barmode="group"))
    return latency, _div(sp, "chart-speedup"), base


# --------------------------------------------------------------------------- view model


def _view(report: dict) -> dict:
    status = report.get("status", "unknown")
    title, tone = _STATUS.get(status, (status, "fail"))
    summary = report.get("summary") or title
    model = report.get("model") or {}
    exp = report.get("export") or {}
    check = report.get("check")
    val = report.get("validation")
    bench = report.get("benchmark")
    diags = [dict({"severity": "info", "code": "", "message": "", "module": None, "node": None, "hint": None}, **d)
             for d in report.get("diagnostics") or []]
    diags.sort(key=lambda d: {"error": 0, "warning": 1}.get(d["severity"], 2))

    cases = []
    tol = (val or {}).get("tolerance") or {}
    if val:
        for i, c in enumerate(val.get("cases") or [], 1):
            cases.append(dict(c, index=i, label=c.get("label") or f"#{i}", shapes_text=_fmt_shapes(c.get("shapes")),
                              sizes_text=_fmt_sizes(c.get("sizes")), error=c.get("error"),
                              max_abs_err=c.get("max_abs_err"), max_rel_err=c.get("max_rel_err"),
                              passed=bool(c.get("passed"))))
    failed_cases = [c for c in cases if not c["passed"]]

    charts: dict[str, str | None] = {"ops": None, "errors": None, "latency": None, "speedup": None,
                                     "samples": None}
    histogram = dict((check or {}).get("op_histogram") or {})
    if histogram:
        charts["ops"] = _ops_figure(histogram)
    if cases:
        charts["errors"] = _errors_figure(cases, tol.get("atol"))
    samples = _samples_view((val or {}).get("samples"))
    if samples and samples.get("errors"):
        charts["samples"] = _samples_figure(samples["errors"], samples.get("failing") or [],
                                            (samples.get("tolerance") or tol).get("atol"))
    runs = [r for r in (bench or {}).get("runs") or [] if r.get("p50_ms") is not None]
    baseline = None
    if runs:
        charts["latency"], charts["speedup"], baseline = _bench_figures(runs)

    dims = []
    for d in (check or {}).get("dynamic_dims") or []:
        dims.append(dict(d, min=d.get("min"), max=d.get("max"), sizes_passed=d.get("sizes_passed") or [],
                         fixed_to=d.get("fixed_to")))
    n_ok = sum(c["passed"] for c in cases)
    facts = [("model", model.get("name") or "–")]
    if exp.get("exporter"):
        facts.append(("exporter", f"{exp['exporter']} · opset {exp.get('opset')}"))
    if cases:
        facts.append(("cases passed", f"{n_ok}/{len(cases)}"))
    if dims:
        facts.append(("dynamic dims proven", f"{sum(bool(d['proven']) for d in dims)}/{len(dims)}"))
    if check:
        facts.append(("nodes", _fmt_int(check.get("nodes"))))
    env = report.get("environment") or {}
    env_rows = [(k, env.get(k)) for k in ("python", "platform") if env.get(k)]
    cpu = env.get("cpu") or {}
    if cpu:
        env_rows.append(("CPU", " · ".join(str(x) for x in (cpu.get("model"), f"{cpu['cores']} cores"
                                                             if cpu.get("cores") else None,
                                                             " ".join(cpu.get("flags") or [])) if x)))
    variants = _variants_view(report.get("variants") or [])
    model_path = exp.get("path") or ("model.onnx" if status == "ok" else None)
    return {
        "status": status, "title": title, "tone": tone,
        "summary": summary, "summary_short": summary if len(summary) <= VERDICT_CHARS
        else summary[:VERDICT_CHARS].rstrip() + "…",
        "facts": facts,
        "version": report.get("onnxport_version", "?"), "created_at": report.get("created_at"),
        "command": report.get("command"), "model": model, "export": exp,
        "attempts": exp.get("attempts") or [], "inputs": exp.get("inputs") or [], "outputs": exp.get("outputs") or [],
        "check": check, "dims": dims, "histogram": sorted(histogram.items(), key=lambda kv: (-kv[1], kv[0])),
        "validation": val, "tolerance": tol, "cases": cases, "failed_cases": failed_cases, "n_ok": n_ok,
        "divergence": (val or {}).get("divergence"), "samples": samples,
        "variants": variants, "variants_on_samples": any(x["on_samples"] for x in variants), "benchmark": bench, "runs": runs, "baseline": baseline,
        "diagnostics": diags, "n_errors": sum(d["severity"] == "error" for d in diags),
        "environment": env, "env_rows": env_rows, "packages": sorted((env.get("packages") or {}).items()),
        "timings": report.get("timings") or {}, "model_path": model_path, "charts": charts,
        "open_rows": OPEN_ROWS, **_parts_view(report),
    }


def _parts_view(report: dict) -> dict:
    """A model made of several: its models (report.json's ``components``) and their proof together."""
    joint = report.get("joint_proof")
    return {"components": [c for c in report.get("components") or [] if isinstance(c, dict)],
            "joint": joint if isinstance(joint, dict) else None}


# --------------------------------------------------------------------------- rendering


@functools.lru_cache(maxsize=1)
def _env():
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("onnxport.report", "templates"),
                             autoescape=True, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(latencies=_fmt_latencies, err=_fmt_err, int=_fmt_int, bytes=_fmt_bytes, num=_fmt_num, shape=_fmt_shape,
                       metric=_fmt_metric)
    return env


@functools.lru_cache(maxsize=1)
def assets() -> tuple[str, str]:
    """(the page's CSS, plotly.js inlined): the page opens offline."""
    import plotly.offline

    css = resources.files(__package__).joinpath("templates", "report.css").read_text(encoding="utf-8")
    return css, plotly.offline.get_plotlyjs()


def render_html(report: dict) -> str:
    """The report as one self-contained HTML page (opens offline; no request leaves the page)."""
    from markupsafe import Markup

    css, plotly_js = assets()
    view = _view(report)
    return _env().get_template("report.html.j2").render(
        v=view, css=Markup(css), plotly_js=Markup(plotly_js),
        charts={k: (Markup(s) if s else None) for k, s in view["charts"].items()})
