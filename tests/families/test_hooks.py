"""A family that is a parameter of the one pipeline (docs/architecture.md, "Model families"): a toy family with
:class:`~onnxport.families.Hooks` runs the pipeline's export → prove → optimize stages; the pipeline makes the
export's attempts, the validation's cases, model.onnx and the family's section from the hooks' typed results."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from onnxport import api, families
from onnxport.core.errors import ExportFailed
from onnxport.core.spec import InputSpec
from onnxport.families import PIPELINE_STAGES, Exported, Family, Hooks, Made, Optimized, Proved, Run
from onnxport.runtime.sessions import session
from onnxport.sources.base import LoadedModel


@dataclass(frozen=True)
class Case:
    """One toy case in the shape families.ProvenCase asks for."""

    rows: int
    max_abs_err: float
    passed: bool
    max_rel_err: float = 0.0
    error: str | None = None

    @property
    def label(self) -> str:
        return f"{self.rows} rows"

    @property
    def shapes(self) -> dict[str, list[int]]:
        return {"x": [self.rows, 3]}

    @property
    def sizes(self) -> dict[str, int]:
        return {"rows": self.rows}

    @property
    def errors(self) -> dict[str, float]:
        return {"y": self.max_abs_err}


@dataclass(frozen=True)
class Section:
    file: str
    rows: tuple[int, ...]
    variants: int | None

    def to_dict(self) -> dict:
        return {"file": self.file, "rows": list(self.rows), "variants": self.variants}


def _load(source: str, **_: object) -> LoadedModel:
    model = torch.nn.Linear(3, 2).eval()
    return LoadedModel(source, "toy", "python", model, model, (InputSpec("x", "float32", (1, 3)),), {}, ("y",), 8)


def _export(run: Run) -> Exported:
    path = run.work / "toy.onnx"
    torch.onnx.export(run.loaded.model, (torch.randn(2, 3),), str(path), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "rows"}}, dynamo=False)
    return Exported(path, "toy", 17, 0.5, record="toy layout", tried=("opset 18: refused",), note="toy note")


def _prove(run: Run, exported: Exported) -> Proved:
    assert exported.record == "toy layout"
    sess = session(run.result.path, providers=["CPUExecutionProvider"])
    cases = []
    for rows in (1, 3):
        x = torch.randn(rows, 3)
        with torch.inference_mode():
            want = run.loaded.model(x).numpy()
        err = float(np.abs(sess.run(None, {"x": x.numpy()})[0] - want).max())
        cases.append(Case(rows, err, err < 1e-5))
    return Proved(run.options.proof.tolerance, tuple(cases), all(c.passed for c in cases), record=(1, 3))


def _optimize(run: Run, made: Made) -> Optimized:
    assert run.model_file == run.out / "model.onnx" and run.model_file.is_file()
    return Optimized(record=2)


def _section(run: Run) -> Section:
    made = run.made
    return Section(run.model_file.name, made.proved.record, made.optimized.record if made.optimized else None)


TOY = Family("hooked", PIPELINE_STAGES, detects=lambda source, task: source == "hooked:toy", load=_load,
             check_seq=False, section="hooked", scratch=True,
             hooks=Hooks(export=_export, prove=_prove, section=_section, optimize=_optimize))


@pytest.fixture
def toy():
    families.register(TOY)
    yield TOY
    families.unregister("hooked")


def test_a_family_with_hooks_runs_the_one_pipeline(toy, tmp_path: Path):
    rep = api.convert("hooked:toy", tmp_path / "out", variants="auto")
    assert rep["status"] == "ok", rep["summary"]
    assert rep["export"]["path"] == "model.onnx" and (tmp_path / "out" / "model.onnx").is_file()
    assert [(a["ok"], a["error"], a.get("note")) for a in rep["export"]["attempts"]] == [
        (False, "opset 18: refused", None), (True, None, "toy note")]
    cases = rep["validation"]["cases"]
    assert [c["label"] for c in cases] == ["1 rows", "3 rows"] and cases[1]["shapes"] == {"x": [3, 3]}
    assert cases[0]["sizes"] == {"rows": 1} and set(cases[0]["outputs"]) == {"y"}
    assert rep["hooked"] == {"file": "model.onnx", "rows": [1, 3], "variants": 2}
    assert {"export", "check", "parity", "optimize"} <= set(rep["timings"])
    assert rep["benchmark"] is None and rep["variants"] == []  # its variants are its own; no plain benchmark


def test_an_export_hook_that_fails_ends_the_run_with_its_report(toy, tmp_path: Path):
    def fails(run: Run) -> Exported:
        raise ExportFailed("the toy could not be exported at any opset", "try another toy", code="export-failed")

    families.register(dataclasses.replace(TOY, hooks=dataclasses.replace(TOY.hooks, export=fails)))
    rep = api.convert("hooked:toy", tmp_path / "out")
    assert rep["status"] == "export_failed" and rep["validation"] is None and "hooked" not in rep
    assert rep["summary"] == "Export failed: the toy could not be exported at any opset."
    assert [d["code"] for d in rep["diagnostics"] if d["severity"] == "error"] == ["export-failed"]
    assert (tmp_path / "out" / "report.json").is_file() and not (tmp_path / "out" / "model.onnx").exists()
