"""Diagnostics: what went wrong or looks risky, where (module, node) and what to do."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Diagnostic:
    """One finding. ``code`` is stable (documented in docs/diagnostics.md)."""

    severity: str  # "error" | "warning" | "info"
    code: str
    message: str
    module: str | None = None
    node: str | None = None
    hint: str | None = None
    source: tuple[str, int] | None = None  # the user's (file, line) it points at; not part of the report
    follows_from: str | None = None  # the code of the root cause this one is a consequence of

    def to_dict(self) -> dict:
        out = asdict(self)
        del out["source"]
        return out


def error(code: str, message: str, **kw) -> Diagnostic:
    return Diagnostic("error", code, message, **kw)


def warning(code: str, message: str, **kw) -> Diagnostic:
    return Diagnostic("warning", code, message, **kw)


def info(code: str, message: str, **kw) -> Diagnostic:
    return Diagnostic("info", code, message, **kw)
