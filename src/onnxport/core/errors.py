"""One typed error hierarchy. Every error carries a one-line message, a hint and an exit code."""

from __future__ import annotations

import errno

# Exit codes (public contract).
EXIT_OK = 0
EXIT_VALIDATION_FAILED = 1
EXIT_USAGE = 2
EXIT_EXPORT_FAILED = 3
EXIT_ENVIRONMENT = 4


class OnnxportError(Exception):
    """Base error: ``message`` says what is wrong, ``hint`` what to do next."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, hint: str = "", *, code: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.code = code

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} (hint: {self.hint})"


class UsageError(OnnxportError):
    """Bad command-line usage or bad input files (exit 2)."""

    exit_code = EXIT_USAGE


class ConstrainedDims(UsageError):
    """The model runs at some sizes of a dynamic dim only (exit 2). ``probed`` maps each such dim's symbol to
    (sizes that ran, sizes that failed), so a caller can prove at the sizes that run when the user agrees."""

    def __init__(self, message: str, hint: str, probed: dict[str, tuple[tuple[int, ...], tuple[int, ...]]],
                 rules: dict[str, str] | None = None, sizes: dict[str, tuple[int, ...]] | None = None) -> None:
        super().__init__(message, hint, code="dim-constrained")
        self.probed = probed
        self.rules = rules or {}  # the rule each dim's working sizes follow, where one fits: "multiples of 32"
        self.sizes = sizes or {sym: runs for sym, (runs, _) in probed.items()}  # every size of the range that runs


class BadSamples(UsageError):
    """A ``--samples`` file or folder that cannot be used (exit 2): the file first, then what is wrong with it
    (the line, sample index or image named)."""

    def __init__(self, file: object, problem: str, hint: str) -> None:
        super().__init__(f"--samples {file}: {problem}", hint, code="samples-unreadable")


class SourceError(UsageError):
    """The model source cannot be loaded (exit 2)."""


class ExportFailed(OnnxportError):
    """No exporter produced an ONNX model (exit 3). ``attempts`` holds every try (``Attempt`` records) and
    ``diagnostics`` what the failed tries saw, for the report."""

    exit_code = EXIT_EXPORT_FAILED

    def __init__(self, message: str, hint: str = "", *, code: str = "", attempts: tuple = (),
                 diagnostics: tuple = ()) -> None:
        super().__init__(message, hint, code=code)
        self.attempts = tuple(attempts)
        self.diagnostics = tuple(diagnostics)


class ValidationFailed(OnnxportError):
    """The ONNX model was produced but could not be proven (exit 1)."""

    exit_code = EXIT_VALIDATION_FAILED


class EnvironmentProblem(OnnxportError):
    """A dependency is missing or the environment cannot do what was asked (exit 4)."""

    exit_code = EXIT_ENVIRONMENT


class DiskFull(EnvironmentProblem):
    """No space left on the device the run writes to (exit 4): nothing of the run is kept."""

    def __init__(self, where: str = "") -> None:
        at = f" writing {where}" if where else ""
        super().__init__(f"no space left on the device{at}; nothing of this run was kept",
                         "free some space (a large model needs about 3× its weights), or choose an --out on "
                         "another disk", code="disk-full")


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a full disk or an exceeded quota."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def missing_dependency(package: str, extra: str) -> EnvironmentProblem:
    """Error for an optional dependency that is not installed."""
    return EnvironmentProblem(
        f"the Python package '{package}' is not installed",
        f"pip install 'onnxport[{extra}]' (or pip install {package})",
        code="missing-dependency",
    )


def one_line(exc: BaseException | str, limit: int = 300, *, typed: bool = False) -> str:
    """An error's message on one line (each run of whitespace, newlines included, one space), cut at ``limit``
    characters; ``typed``: ``Type: message``, the type alone when the message is empty."""
    text = " ".join(str(exc).split())[:limit]
    if not typed:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
