"""Reports: report.json (validated against the shipped JSON Schema), report.md and report.html."""

from __future__ import annotations

import functools
import json
import os
from importlib import resources
from pathlib import Path

from onnxport.report.html import render_html
from onnxport.report.markdown import render_markdown

__all__ = ["schema", "validate", "write_json", "write_all", "render_markdown", "render_html", "load"]


@functools.lru_cache(maxsize=1)
def schema() -> dict:
    """The JSON Schema of report.json."""
    return json.loads(resources.files(__package__).joinpath("schema.json").read_text())


def validate(report: dict) -> None:
    """Raise jsonschema.ValidationError if ``report`` breaks the contract."""
    import jsonschema

    jsonschema.validate(report, schema())


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json(report: dict, out: Path) -> Path:
    path = Path(out) / "report.json"
    _atomic_write(path, json.dumps(report, indent=2, default=str) + "\n")
    return path


def write_all(report: dict, out: Path) -> list[Path]:
    """Write report.json, report.md and report.html into ``out``."""
    out = Path(out)
    paths = [write_json(report, out)]
    md = out / "report.md"
    _atomic_write(md, render_markdown(report))
    paths.append(md)
    page = out / "report.html"
    _atomic_write(page, render_html(report))
    paths.append(page)
    return paths


def load(out: Path) -> dict:
    return json.loads((Path(out) / "report.json").read_text(encoding="utf-8"))
