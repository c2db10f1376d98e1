"""What the environment of an encoder-decoder's Triton python-backend model (``1/model.py``) needs, and the rule
by which ``onnxport triton`` warns that the versions it writes for cannot work together.

The rule: the model needs ``numpy<2`` (Triton 2.51's python backend stub misreads numpy 2 arrays: every response
fails with "output tensor shape does not match size of output") and the onnxruntime release that made and proved
its files, or a later one. They cannot work together when that onnxruntime requires numpy 2 or later."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

TRITON_VERSION = "2.51"  # the Triton Inference Server the python-backend model is tested on (nvidia-pytriton 0.7.0)
NUMPY_REQUIREMENT = "numpy<2"
# the last release of each numpy 1.x line that onnxruntime ever supported: a requirement admitting none of
# these admits no numpy < 2 that onnxruntime runs with
_NUMPY_1 = ("1.26.4", "1.25.2", "1.24.4", "1.23.5", "1.22.4", "1.21.6")


@dataclass(frozen=True)
class ModelEnvironment:
    """The versions a python-backend model's files were made with: onnxruntime's, and the files' newest
    default-domain opset and ONNX IR version (None where unknown)."""

    onnxruntime: str | None
    opset: int | None
    ir_version: int | None

    def requirements(self) -> list[str]:
        """pip requirements of the model's environment."""
        return [NUMPY_REQUIREMENT, f"onnxruntime>={self.onnxruntime}" if self.onnxruntime else "onnxruntime"]

    def lines(self) -> list[str]:
        """What the environment needs, in words: config.pbtxt's comments (without their "# ")."""
        files = ", ".join(f for f in (f"opset {self.opset}" if self.opset else "",
                                      f"ONNX IR version {self.ir_version}" if self.ir_version else "") if f)
        made = (f"were made and proven with onnxruntime {self.onnxruntime}" if self.onnxruntime
                else "were made with onnxruntime")
        return [f"Environment: the python backend's stub needs {' and '.join(self.requirements())} "
                f"(pip install {' '.join(repr(r) for r in self.requirements())}).",
                f"  numpy<2: Triton {TRITON_VERSION}'s python backend stub misreads numpy 2 arrays (every response "
                "fails with",
                "  'output tensor shape does not match size of output').",
                f"  onnxruntime: the files{f' ({files})' if files else ''} {made};",
                "  an older release runs them only if it implements that opset.",
                "Give the stub a venv of the Python whose libpython it loads (numpy<2 has no wheel for Python 3.13",
                "or later), first on tritonserver's PATH, or for this model alone:",
                '  parameters { key: "EXECUTION_ENV_PATH" value { string_value: "/path/to/venv" } }',
                "(docs/seq2seq.md, Triton)."]


def numpy_requirements(dist: str = "onnxruntime") -> list[str]:
    """The numpy requirements the installed distribution ``dist`` declares (empty when not installed)."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        declared = importlib.metadata.requires(dist) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    out = []
    for text in declared:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.name.lower() == "numpy" and (req.marker is None or req.marker.evaluate({"extra": ""})):
            out.append(str(req.specifier))
    return out


def environment_problems(onnxruntime: str | None, numpy_specifiers: list[str]) -> list[str]:
    """Why ``numpy<2`` and onnxruntime ``onnxruntime`` cannot share the model's environment (empty: they can, or
    nothing is known): ``numpy_specifiers`` are that onnxruntime's own numpy requirements (">=1.21.6")."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    if not onnxruntime:
        return []
    for text in numpy_specifiers:
        try:
            spec = SpecifierSet(text)
        except InvalidSpecifier:
            continue
        if not any(spec.contains(v) for v in _NUMPY_1):
            return [f"onnxruntime {onnxruntime} requires numpy{text}, but Triton {TRITON_VERSION}'s python backend "
                    "needs numpy<2: no environment runs this model there; export it with an onnxruntime that "
                    "accepts numpy 1.x, or serve it with 'onnxport serve'"]
    return []


def model_environment(files: list[Path], report: dict | None) -> ModelEnvironment:
    """The versions of ``files`` (ONNX, external data not read): report.json's onnxruntime (``environment``),
    else the installed one."""
    import onnx

    opsets, irs = [], []
    for file in files:
        model = onnx.load(str(file), load_external_data=False)
        irs.append(int(model.ir_version))
        opsets += [int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")]
    packages = ((report or {}).get("environment") or {}).get("packages") or {}
    version = packages.get("onnxruntime")
    if not version:
        try:
            version = importlib.metadata.version("onnxruntime")
        except importlib.metadata.PackageNotFoundError:
            version = None
    return ModelEnvironment(version, max(opsets, default=None), max(irs, default=None))


def check(env: ModelEnvironment) -> list[str]:
    """:func:`environment_problems` for ``env``, the numpy requirements read from the installed onnxruntime when it
    is the release that made the files (else unknown: no warning)."""
    from onnxport.runtime.environment import onnxruntime_package

    installed = onnxruntime_package()
    if not env.onnxruntime or installed.get("onnxruntime") != env.onnxruntime:
        return []
    return environment_problems(env.onnxruntime, numpy_requirements(installed.get("onnxruntime_package")
                                                                    or "onnxruntime"))
