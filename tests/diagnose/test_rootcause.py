"""One root cause first: the headline names the cause; what follows from it is listed under it."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from onnxport.core.diagnostics import error, warning
from onnxport.core.records import FP32, CaseResult, Failure, ParityResult
from onnxport.diagnose import rootcause
from tests.conftest import FIXTURES, load_report
from tests.fixtures import forked_cli

RC = FIXTURES / "rootcause.py"
cli = forked_cli.cli  # a fixture: commands forked from one process that did the CLI's imports once


def _errors(rep: dict) -> list[dict]:
    return [d for d in rep["diagnostics"] if d["severity"] == "error"]


def test_rank_puts_the_operator_first_and_keeps_everything():
    diags = [error("unsupported-operator", "dynamo: no translation for aten._linalg_svd"),
             error("unsupported-operator", "torchscript: no translation for aten::linalg_svdvals", module="m"),
             warning("tracer-warning", "x"), error("export-failed", "no exporter could export the model")]
    ranked = rootcause.rank(diags)
    assert ranked[0].module == "m" and ranked[0].follows_from is None
    assert [d.code for d in ranked[1:2]] == ["export-failed"] and ranked[1].follows_from == "unsupported-operator"
    assert len(ranked) == len(diags)


def _parity(errs: list[float], passed: list[bool] | None = None) -> ParityResult:
    passed = passed or [False] * len(errs)
    cases = tuple(CaseResult(f"c{i}", {}, "random", e, e, p, None if p else "differs",
                             failure=None if p else Failure.MISMATCH) for i, (e, p) in enumerate(zip(errs, passed)))
    return ParityResult(all(passed), FP32, cases)


def test_precision_is_named_only_when_every_shape_fails_by_a_small_similar_error():
    fail = [error("parity-failed", "8 of 8 fail"), error("divergence", "outputs first differ at module conv1")]
    ranked = rootcause.rank(fail, _parity([2e-3, 1.5e-3, 2.1e-3]))
    assert ranked[0].code == "reduced-precision" and all(d.follows_from == "reduced-precision" for d in ranked[1:])
    assert rootcause.rank(fail, _parity([2e-3, 1.0]))[0].code != "reduced-precision"  # grows with shape: no
    assert rootcause.rank(fail, _parity([2e-3, 2e-3], [True, False]))[0].code != "reduced-precision"
    assert rootcause.rank(fail, _parity([1.3, 1.2]))[0].code != "reduced-precision"  # too large for rounding


def test_a_frozen_branch_is_the_headline_not_the_innocent_linear(tmp_path, cli):
    out = tmp_path / "o"
    proc = cli("export", f"{RC}:FrozenChoice", "-i", "x:float32[batch,seq,4]", "--exporter", "torchscript",
                   "-o", str(out))
    assert proc.returncode == 1
    rep = load_report(out)
    errs = _errors(rep)
    assert errs[0]["code"] == "frozen-branch" and errs[0]["follows_from"] is None
    assert "rootcause.py:19" in errs[0]["message"]
    assert rep["summary"].startswith("Not proven") and "rootcause.py:19" in rep["summary"]
    blames_neg = [d for d in errs if "neg" in d["message"]]
    assert blames_neg and all(d["follows_from"] == "frozen-branch" for d in blames_neg)
    assert all(d["follows_from"] == "frozen-branch" for d in errs[1:])
    assert "↳" in proc.stderr  # listed under the cause in the terminal too


def test_a_baked_in_size_blames_that_dim_alone(tmp_path, cli):
    out = tmp_path / "o"
    proc = cli("export", f"{RC}:FixedSeq", "-i", "x:float32[batch,seq,4]", "--exporter", "torchscript",
                   "-o", str(out))
    assert proc.returncode == 1
    rep = load_report(out)
    errs = _errors(rep)
    assert errs[0]["code"] == "frozen-branch" and "'seq'" in errs[0]["message"] and "'batch'" not in errs[0]["message"]
    proven = {d["symbol"]: d["proven"] for d in rep["check"]["dynamic_dims"]}
    assert proven == {"batch": True, "seq": False}  # proven by cases that change batch alone
    assert any(c["label"].startswith("batch alone at") and c["passed"] for c in rep["validation"]["cases"])
    unproven = [d for d in errs if d["code"] == "dynamic-dim-unproven"]
    assert len(unproven) == 1 and "'seq'" in unproven[0]["message"]


def test_a_missing_operator_is_the_summary_not_the_last_strategys_shrug(tmp_path, cli):
    out = tmp_path / "o"
    proc = cli("export", f"{RC}:SingularValues", "-i", "x:float32[batch,3,3]", "-o", str(out))
    assert proc.returncode == 3
    rep = load_report(out)
    assert "svd" in rep["summary"] and "not applicable" not in rep["summary"]
    assert "svd" in proc.stderr.splitlines()[0]  # the first line the terminal shows
    assert _errors(rep)[0]["code"] == "unsupported-operator"


def test_rounding_everywhere_is_named_precision_not_a_frozen_branch(tmp_path, cli):
    exported = tmp_path / "exp"
    assert cli("export", f"{RC}:DeepMLP", "-i", "x:float32[batch,64]", "--exporter", "torchscript",
                   "-o", str(exported)).returncode == 0
    model = onnx.load(exported / "model.onnx")
    for init in model.graph.initializer:  # weights rounded to fp16, computed in fp32: a reduced-precision kernel
        arr = numpy_helper.to_array(init)
        if arr.dtype == np.float32:
            init.CopyFrom(numpy_helper.from_array(arr.astype(np.float16).astype(np.float32), init.name))
    onnx.save(model, tmp_path / "rounded.onnx")
    out = tmp_path / "o"
    proc = cli("compare", f"{RC}:DeepMLP", str(tmp_path / "rounded.onnx"), "-i", "x:float32[batch,64]",
                   "-o", str(out))
    assert proc.returncode == 1
    rep = load_report(out)
    errs = _errors(rep)
    assert errs[0]["code"] == "reduced-precision", [d["code"] for d in errs]
    assert not any(d["code"] in ("dynamic-dim-unproven", "frozen-branch") for d in errs)
    assert all(d["follows_from"] == "reduced-precision" for d in errs[1:])


def test_the_kept_files_own_evidence_is_named_first():
    """A TorchScript file kept after dynamo failed: its tracer's line is where it froze, not the line of the
    dynamo attempt's guard (Mask R-CNN: a guard in the eager batch_images that tracing never runs)."""
    from pathlib import Path

    from onnxport.api import load_model
    from onnxport.core.records import Attempt, ExportResult
    from onnxport.diagnose.explain import lost_control_flow

    traps = str(FIXTURES / "traps.py")
    loaded = load_model(f"{traps}:ShapeBranch", inputs=["x:float32[batch,seq,4]"], dims=["seq=1..32"])
    dynamo = Attempt("dynamo", False, 1.0, 18, error="GuardOnDataDependentSymNode", guards=(("u0 > 8", traps, 35),))
    traced = Attempt("torchscript", True, 1.0, 18, frozen="tracing turned a tensor into a Python value")
    warned = warning("tracer-warning", "traps.py:11: Converting a tensor to a Python boolean", source=(traps, 11))
    result = ExportResult(Path("m.onnx"), "torchscript", 18, 1.0, (dynamo, traced), False, (warned,))
    [lost] = lost_control_flow(result, loaded)
    assert lost.source == (traps, 11) and "traps.py:11" in lost.message
