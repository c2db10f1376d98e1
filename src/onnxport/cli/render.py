"""What the terminal shows: the verdict first, then the facts that support it (all on stderr; stdout belongs
to --json)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

err = Console(stderr=True, soft_wrap=True, highlight=False, markup=False,
              width=None if sys.stderr.isatty() else 120)


def _shape(shape) -> str:
    if shape is None:
        return "?"
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def print_summary(c: dict) -> None:
    err.print(f"  graph     IR {c['ir_version']} · opset {c['opset']} · {c['nodes']} nodes · "
              f"{c['initializers']} initializers · {c['parameters']:,} parameters · {c['bytes'] / 1e6:.1f} MB")
    top = ", ".join(f"{k}×{v}" for k, v in list(c["op_histogram"].items())[:8])
    err.print(f"  ops       {top}")
    for io in c["inputs"]:
        err.print(f"  input     {io['name']} {io['dtype']}{_shape(io['shape'])}")
    for io in c["outputs"]:
        err.print(f"  output    {io['name']} {io['dtype']}{_shape(io['shape'])}")


def print_report(rep: dict, out: Path) -> None:
    """The terminal summary: verdict first, then the facts that support it."""
    status = rep["status"]
    style = {"ok": "bold green", "validation_failed": "bold red", "export_failed": "bold red"}[status]
    mark = "✔" if status == "ok" else "✘"
    err.print(f"[{style}]{mark} {status}[/]  {escape(rep['summary'])}", markup=True)
    _print_export(rep, out)
    _print_runtime(rep, out)
    _print_validation(rep, out)
    _print_variants(rep, out)
    _print_benchmark(rep, out)
    _print_divergence(rep, out)
    _print_diagnostics(rep, out)
    if rep.get("log"):
        err.print(f"  log       {out / rep['log']} (what the libraries printed)")
    err.print(f"  report    {out / 'report.json'}")


def _print_export(rep: dict, out: Path) -> None:
    m = rep["model"]
    err.print(f"  model     {m['name']} ({m['kind']}) · {m['parameters']:,} parameters")
    exp = rep["export"]
    def mark(a: dict) -> str:
        if a.get("not_applicable"):
            return f"{a['exporter']} –"
        return f"{a['exporter']} {('✔ froze' if a.get('frozen') else '✔') if a['ok'] else '✘'} {a['seconds']:.1f}s"

    tries = ", ".join(mark(a) for a in exp["attempts"])
    err.print(f"  export    {exp['exporter'] or '-'} · opset {exp['opset'] or '-'} · attempts: {tries}")
    for a in exp["attempts"]:
        if a["error"] or a.get("frozen"):
            err.print(f"            [dim]{a['exporter']}: {escape(a['error'] or a['frozen'])}[/]", markup=True)
    if rep["check"]:
        c = rep["check"]
        err.print(f"  file      {out / exp['path'] if exp.get('path') else '-'}")
        print_summary(c)
        by_symbol: dict[str, list[dict]] = {}
        for d in c["dynamic_dims"]:
            by_symbol.setdefault(d["symbol"], []).append(d)
        for sym, ds in by_symbol.items():
            proven = all(d["proven"] for d in ds)
            ok = "[green]proven[/]" if proven else "[red]NOT proven[/]"
            sizes = ",".join(map(str, ds[0].get("sizes_passed", [])))
            where = escape(", ".join(f"{d['input']}[{d['axis']}]" for d in ds))
            err.print(f"  dim       {escape(sym)} {ds[0]['min']}..{ds[0]['max']} ({where}) {ok} at sizes {sizes or '-'}",
                      markup=True)


def _print_runtime(rep: dict, out: Path) -> None:
    rt = rep.get("runtime")
    if rt:
        placed = ", ".join(f"{p} ({n} nodes)" for p, n in (rt.get("nodes_per_provider") or {}).items())
        err.print(f"  runtime   {rt['device']} · {placed or ', '.join(rt['providers_used'])}")
        if rt["cpu_fallback_nodes"]:
            err.print(f"[yellow]  fallback  {len(rt['cpu_fallback_nodes'])} node(s) on the CPU: "
                      f"{escape(', '.join(rt['cpu_fallback_nodes'][:8]))}[/]", markup=True)


def _print_validation(rep: dict, out: Path) -> None:
    val = rep.get("validation")
    if val:
        t = Table(title=f"validation (atol {val['tolerance']['atol']}, rtol {val['tolerance']['rtol']})")
        for col in ("case", "sizes", "max abs err", "max rel err", "pass"):
            t.add_column(col)
        swept: dict[str, list[dict]] = {}
        for c in val["cases"]:
            label = c.get("label", "")
            dim = label.split("=", 1)[0] if "=" in label and " " not in label else None
            if dim is not None and c["passed"]:  # a passing sweep of a short range: one row per dim below
                swept.setdefault(dim, []).append(c)
                continue
            sizes = c.get("sizes") or {}
            shapes = (" ".join(f"{k}={v}" for k, v in sizes.items()) if sizes
                      else " ".join(f"{k}{_shape(v)}" for k, v in c["shapes"].items()))
            mark = "[green]✔[/]" if c["passed"] else f"[red]✘[/] {escape(c.get('error') or '')}"
            fa = "-" if c["max_abs_err"] is None else f"{c['max_abs_err']:.2e}"
            fr = "-" if c["max_rel_err"] is None else f"{c['max_rel_err']:.2e}"
            t.add_row(label, shapes, fa, fr, Text.from_markup(mark))
        for dim, cs in swept.items():
            fa = max((c["max_abs_err"] or 0.0) for c in cs)
            fr = max((c["max_rel_err"] or 0.0) for c in cs)
            sizes = ",".join(str((c.get("sizes") or {}).get(dim, "?")) for c in cs)
            t.add_row(f"every {dim}", f"{dim}={sizes}", f"{fa:.2e}", f"{fr:.2e}", Text.from_markup("[green]✔[/]"))
        err.print(t)
        for name, own in (val.get("own_scale") or {}).items():
            err.print(f"  output {escape(name)} judged at its own scale: atol {own['atol']:.2e} (magnitude "
                      f"{(own.get('magnitude') or 0):.2e}, case '{escape(own.get('case') or '')}')", markup=True)
        for name, why in (val.get("cannot_tell") or {}).items():
            err.print(f"  [yellow]output {escape(name)} cannot tell[/]: PyTorch's is {escape(why)}", markup=True)
        _print_samples(val.get("samples"))
        for b in val.get("branches") or []:
            seen = b.get("sides") or {f"{k} iterations": v for k, v in (b.get("trip_counts") or {}).items()}
            what = "; ".join(f"{k} on '{v}'" for k, v in seen.items() if v)
            ok = "[green]both sides[/]" if b["op"] == "If" else "[green]several trip counts[/]"
            ok = ok if b["covered"] else "[yellow]partly[/]"
            err.print(f"  {b['op']:<9} {escape(b['node'])} ({escape(b.get('module') or 'model')}) {ok}: {escape(what)}",
                      markup=True)


def _print_samples(s: dict | None) -> None:
    """One line for the proof on the user's samples, and the first failing one."""
    if not s:
        return
    m = s.get("metrics") or {}
    shown = [f"{label} {m[key]:.4f}" for key, label in (("top1_agreement", "top-1"),
                                                         ("topk_agreement", f"top-{m.get('k', 5)}"),
                                                         ("cosine_min", "cosine ≥"))
             if isinstance(m.get(key), (int, float))]
    mark = "[green]✔[/]" if s["passed"] else "[red]✘[/]"
    mae = "-" if s.get("max_abs_err") is None else f"{s['max_abs_err']:.2e}"
    err.print(f"  samples   {mark} {s['count'] - s['failed']}/{s['count']} of {escape(s['file'])} ({s['kind']}) match, "
              f"max abs err {mae}" + (f" · {', '.join(shown)}" if shown else ""), markup=True)
    for f in (s.get("failures") or [])[:1]:
        where = "" if f["where"] == f"sample {f['index']}" else f" ({f['where']})"
        err.print(f"            [red]sample {f['index']}{escape(where)}: {escape(f['error'])}[/]", markup=True)


def _not_built() -> frozenset[str]:
    """The skip reasons of variants left out before building (the plan, a missing library, the budget): listed
    on one line, not in the table. (Imported here, not at the top: the command line starts without the
    optimize layer, whose modules import torch.)"""
    from onnxport.optimize.result import SkipReason

    return frozenset({SkipReason.NOT_PLANNED.value, SkipReason.NOT_BUILT.value, SkipReason.BUDGET.value})


def _print_variants(rep: dict, out: Path) -> None:
    entries = rep.get("variants") or []
    not_built = [v["name"] for v in entries if v.get("skip_reason") in _not_built()] if entries else []
    shown = [v for v in entries if v["name"] not in not_built]
    if shown:
        batches = sorted({k for v in shown for k in (v.get("latency_ms") or {})}, key=int) or ["1"]
        at = {**((rep.get("best") or {}).get("timed_at") or {}), "batch": ", ".join(batches)}
        where = ", ".join(f"{k} {v}" for k, v in at.items())
        t = Table(title=f"variants (each re-proven against PyTorch; timed at {where}; speedup: geometric mean over "
                        "the batches, what the best is chosen by)")
        on_samples = any(v.get("samples") for v in shown)
        for col in ("variant", "nodes", "MB", "max abs err", "metric", *(["on samples"] if on_samples else []),
                    *(f"p50 ms b{k}" for k in batches), "speedup", "verdict"):
            t.add_column(col)
        for v in shown:
            row = _variant_row(rep, v, batches)
            t.add_row(*(row[:5] + [_sample_metric(v)] + row[5:] if on_samples else row))
        err.print(t)
    if not_built:
        why: dict[str, list[str]] = {}
        for v in entries:
            if v["name"] in not_built:
                text = re.sub(r"^not built( by default)?: ", "", v.get("skipped") or "")
                why.setdefault(re.sub(r" \(--variants [^)]*\)$", "", text), []).append(v["name"])
        err.print(f"  not built {', '.join(not_built)} (--variants all builds them; report.json says why):")
        for text, names in why.items():
            err.print(f"            {escape(', '.join(names))}: {escape(text)}", markup=True)


def _variant_row(rep: dict, v: dict, batches: list[str]) -> list:
    """One variant's row; ``speedup`` is the geometric mean over the batches timed (what the best is chosen by),
    the batch-1 figure where that is all there is."""
    m = v.get("metric") or {}
    metric = f"{m.get('name')} {m.get('value'):.4f} (≥ {m.get('threshold')})" if m.get("value") is not None else "-"
    lat = v.get("latency_ms") or {}
    speedup = (v.get("details") or {}).get("geomean_speedup") or v.get("speedup")
    if v.get("skipped"):
        verdict = f"[dim]– {escape(str(v['skipped'])[:100])}[/]"
    else:
        verdict = "[green]✔[/]" if v["passed"] else f"[red]✘[/] {escape(str(v.get('reason') or ''))[:80]}"
    if rep.get("best") and rep["best"]["name"] == v["name"]:
        verdict += " [bold]best[/]"
    mae = v.get("max_abs_err")
    return [v["name"], str(v.get("nodes") or "-"), f"{(v.get('bytes') or 0) / 1e6:.1f}",
            "-" if mae is None else f"{mae:.2e}", metric,
            *("-" if lat.get(k) is None else f"{lat[k]:.2f}" for k in batches),
            "-" if speedup is None else f"{speedup:.2f}×", Text.from_markup(verdict)]


def _sample_metric(v: dict) -> str:
    s = v.get("samples")
    if not s:
        return "-"
    shown = [f"{m['name']} {m['value']:.4f}" for m in s.get("metrics") or [] if m.get("value") is not None]
    return ", ".join(shown) or ("✔" if s["passed"] else f"{s['failed']} samples off")


def _print_benchmark(rep: dict, out: Path) -> None:
    b = rep.get("benchmark")
    if b and b.get("runs"):
        peak = b.get("peak_gflops")
        t = Table(title=f"benchmark ({b['threads']} threads" + (f", GEMM peak {peak:.0f} GFLOP/s)" if peak else ")"))
        for col in ("backend", "batch", "p50 ms", "p90 ms", "p99 ms", "items/s", "% peak", "speedup"):
            t.add_column(col)
        for r in b["runs"]:
            pct = r.get("peak_pct")
            sp = r.get("speedup")
            t.add_row(r["backend"], str(r["batch"]) + (f"×{r['seq']}" if r.get("seq") else ""), f"{r['p50_ms']:.2f}",
                      f"{r['p90_ms']:.2f}", f"{r['p99_ms']:.2f}", f"{r['throughput']:.1f}",
                      "-" if pct is None else f"{pct:.0f}%", "-" if sp is None else f"{sp:.2f}×")
        err.print(t)


def _print_divergence(rep: dict, out: Path) -> None:
    div = (rep.get("validation") or {}).get("divergence")
    if div and div.get("trace"):
        t = Table(title=f"where PyTorch and ONNX part (case '{div['case']}')")
        for col in ("module", "type", "ONNX node", "op", "max abs err", ""):
            t.add_column(col)
        trace = div["trace"]
        first_bad = next((i for i, e in enumerate(trace) if not e["passed"] and not e.get("fused_into")), len(trace))
        for e in trace[max(0, first_bad - 3): first_bad + 4]:
            err_ = "-" if e["max_abs_err"] is None else f"{e['max_abs_err']:.2e}"
            mark = ("[green]✔[/]" if e["passed"] else
                    f"[yellow]fused into {escape(e['fused_into'])}[/]" if e.get("fused_into") else "[red]✘[/]")
            t.add_row(e["module"], e["module_type"], str(e["node"]), str(e["op"]), err_, Text.from_markup(mark))
        err.print(t)


def _print_diagnostics(rep: dict, out: Path) -> None:
    for d in rep["diagnostics"]:
        color = {"error": "red", "warning": "yellow"}.get(d["severity"], "blue")
        where = escape(f" [{d['module']}]") if d.get("module") else ""
        lead = "  ↳ " if d.get("follows_from") else ""  # a consequence, listed under its root cause
        err.print(f"{lead}[{color}]{d['severity']}[/] {d['code']}{where}: {escape(d['message'])}", markup=True)
        if d.get("hint") and d["severity"] != "info" and not d.get("follows_from"):
            err.print(f"    hint: {d['hint']}")
