"""A new model family is one package and one registration: a toy family, registered here, runs end to end
through ``onnxport.export`` — its detection, its refusals, its loader, its stage and its report section — with
pipeline.py and serve/ untouched."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from onnxport import api, families
from onnxport.core.errors import UsageError
from onnxport.core.options import Options
from onnxport.core.records import FP32, Attempt, ExportResult, ParityResult
from onnxport.core.spec import InputSpec
from onnxport.families import Family, Run, Stage
from onnxport.prove.check import check
from onnxport.report.build import Outcome
from onnxport.sources.base import LoadedModel
from tests.conftest import load_report


@dataclass(frozen=True)
class ToySection:
    """The toy family's own report section."""

    file: str
    width: int

    def to_dict(self) -> dict:
        return {"file": self.file, "width": self.width}


def _detects(source: str, task: str | None) -> bool:
    return source.startswith("toy:") and task in (None, "toy")


def _refuse(options: Options) -> Options:
    if options.load.dims:
        raise UsageError("--dim does not apply here: a toy model is exported at its one width", "drop it")
    return options


def _load(source: str, **_: object) -> LoadedModel:
    width = int(source.split(":", 1)[1])
    model = torch.nn.Linear(width, 2).eval()
    return LoadedModel(source, "toy", "python", model, model, (InputSpec("x", "float32", (1, width)),), {},
                       ("y",), sum(p.numel() for p in model.parameters()))


def _stage(run: Run) -> Run:
    width = run.loaded.inputs[0].shape[1]
    path = run.out / "toy.onnx"
    t = time.perf_counter()
    torch.onnx.export(run.loaded.model, (torch.randn(1, width),), str(path), input_names=["x"],
                      output_names=["y"], dynamo=False)
    seconds = time.perf_counter() - t
    result = ExportResult(path, "toy", 17, seconds, (Attempt("toy", True, seconds, 17),), False)
    outcome = Outcome(run.loaded, run.options.command, (), dict(run.timings), export=result, check=check(path),
                      parity=ParityResult(True, FP32, ()), model_path=path.name,
                      sections={"toy": ToySection(path.name, width)})
    return run.but(outcome=outcome)


TOY = Family("toy", (Stage("toy_export", _stage, checkpoint=True),), detects=_detects, refuse=_refuse,
             load=_load, check_seq=False, section="toy")


@pytest.fixture
def toy():
    families.register(TOY)
    yield TOY
    families.unregister("toy")


def test_the_toy_family_runs_end_to_end(toy, tmp_path: Path):
    assert families.detect("toy:4", None) is toy
    assert families.detect("toy:4", None, inputs_given=True).name == "model"
    rep = api.export("toy:4", tmp_path / "out")
    assert rep["status"] == "ok" and rep["toy"] == {"file": "toy.onnx", "width": 4}
    assert "toy_export" in rep["timings"] and rep["export"]["exporter"] == "toy"
    assert load_report(tmp_path / "out")["toy"] == rep["toy"]
    assert "toy" in families.sections()


def test_the_toy_family_refuses_what_it_cannot_take(toy, tmp_path: Path):
    with pytest.raises(UsageError, match="--dim does not apply here"):
        api.export("toy:4", tmp_path / "out", dims=["batch=1..4"])
    assert not (tmp_path / "out").exists()


def test_without_its_registration_the_source_is_no_family_s():
    assert families.detect("toy:4", None).name == "model"


def test_the_built_in_families_and_their_order():
    assert [f.name for f in families.families()] == ["seq2seq", "decoder", "diffusion", "model"]
    assert families.sections() == ("seq2seq", "decoder")
    with pytest.raises(ValueError):
        families.register(families.get("decoder"))
