"""report.md: short, for pull-request comments and CI step summaries."""

from __future__ import annotations


def _fmt(x) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.2e}"
    return str(x)


def render_markdown(report: dict) -> str:
    """A few lines and tables: verdict, signature, validation, diagnostics."""
    status = report["status"]
    icon = {"ok": "✅", "validation_failed": "❌", "export_failed": "⛔"}.get(status, "")
    lines = [f"## onnxport: {icon} {status}", "", report.get("summary", ""), ""]
    model = report["model"]
    lines.append(f"**Model** `{model['source']}` ({model['name']}, {model['parameters']:,} parameters)")
    exp = report.get("export") or {}
    if exp.get("exporter"):
        lines.append(f"**Export** {exp['exporter']} exporter, opset {exp['opset']}, {exp['seconds']:.1f} s")
    lines.append("")
    if exp.get("inputs"):
        lines += ["| | name | dtype | shape |", "|---|---|---|---|"]
        for kind in ("inputs", "outputs"):
            for io in exp.get(kind, []):
                lines.append(f"| {kind[:-1]} | `{io['name']}` | {io['dtype']} | {io['shape']} |")
        lines.append("")
    val = report.get("validation")
    if val:
        tol = val["tolerance"]
        lines += [f"**Validation** {'passed' if val['passed'] else 'failed'} "
                  f"(atol {tol['atol']}, rtol {tol['rtol']})", "",
                  "| case | shapes | max abs err | pass |", "|---|---|---|---|"]
        for c in val["cases"]:
            shapes = ", ".join(f"{k}{v}" for k, v in c["shapes"].items())
            lines.append(f"| {c.get('label', '')} | {shapes} | {_fmt(c['max_abs_err'])} | "
                         f"{'✅' if c['passed'] else '❌ ' + (c.get('error') or '')} |")
        lines.append("")
        if val.get("branches"):
            lines += ["| control flow | module | exercised | covered |", "|---|---|---|---|"]
            for b in val["branches"]:
                seen = b.get("sides") or b.get("trip_counts") or {}
                what = ", ".join(f"{k}: {v}" for k, v in seen.items() if v)
                lines.append(f"| {b['op']} `{b['node']}` | {b.get('module') or '–'} | {what} | "
                             f"{'✅' if b['covered'] else '⚠️'} |")
            lines.append("")
    if report.get("diagnostics"):
        lines += ["**Diagnostics**", ""]
        for d in report["diagnostics"]:
            where = f" ({d['module']})" if d.get("module") else ""
            lines.append(f"- **{d['severity']}** `{d['code']}`{where}: {d['message']}"
                         + (f" — {d['hint']}" if d.get("hint") else ""))
        lines.append("")
    return "\n".join(lines) + "\n"
