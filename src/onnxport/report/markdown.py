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
    joint = report.get("joint_proof")
    if isinstance(joint, dict):
        lines += [f"**Together** {'✅' if joint.get('passed') else '❌'} {joint.get('summary', '')}", ""]
    parts = [c for c in report.get("components") or [] if isinstance(c, dict)]
    if parts:
        lines += ["| model | status | file | verdict |", "|---|---|---|---|"]
        lines += [f"| [{c.get('name')}]({str(c.get('report')).replace('.json', '.md')}) | {c.get('status')} | `{c.get('file') or '–'}` | "
                  f"{c.get('summary') or ''} |" for c in parts]
        lines.append("")
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
        lines += _samples(val.get("samples"), report.get("variants") or [])
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


def _samples(s: dict | None, variants: list[dict]) -> list[str]:
    """The proof on the user's samples, and each variant's metrics on them."""
    if not s:
        return []
    m = s.get("metrics") or {}
    shown = [f"{label} {m[key]:.4f}" for key, label in (("top1_agreement", "top-1 agreement"),
                                                         ("topk_agreement", f"top-{m.get('k', 5)} agreement"),
                                                         ("cosine_min", "lowest cosine"))
             if isinstance(m.get(key), (int, float))]
    lines = [f"**Samples** {s['count'] - s['failed']}/{s['count']} of `{s['file']}` ({s['kind']}) match PyTorch, "
             f"max abs err {_fmt(s.get('max_abs_err'))}" + (f"; {', '.join(shown)}" if shown else ""), ""]
    for f in (s.get("failures") or [])[:5]:
        where = "" if f["where"] == f"sample {f['index']}" else f" ({f['where']})"
        lines.append(f"- ❌ sample {f['index']}{where}: {f['error']}")
    judged = [v for v in variants if v.get("samples")]
    if judged:
        lines += ["", "| variant | on the samples | verdict |", "|---|---|---|"]
        for v in judged:
            metrics = ", ".join(f"{x['name']} {x['value']:.4f}" for x in v["samples"].get("metrics") or []
                                if x.get("value") is not None) or "–"
            verdict = "✅" if v["passed"] else "❌ " + str(v.get("reason") or "")
            lines.append(f"| {v['name']} | {metrics} | {verdict} |")
    return lines + [""]
