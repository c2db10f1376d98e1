"""Export strategies on tiny models: dynamo, TorchScript, the auto fallback, opsets and external data."""

from __future__ import annotations

import onnx
import pytest

from onnxport.api import load_model
from onnxport.core.errors import ExportFailed, UsageError
from onnxport.core.logs import captured_output
from onnxport.exporters.chain import export
from onnxport.exporters.opsets import default_opset, exporter_max_opset, onnxruntime_max_opset
from onnxport.prove.check import check
from onnxport.prove.parity import compare
from tests.conftest import FIXTURES, MODELS


def _mlp():
    return load_model(f"{MODELS}:TinyMLP", inputs=["x:float32[batch,8]"], dims=["batch=1..32"])


def test_default_opset_is_newest_supported_by_both():
    assert onnxruntime_max_opset() >= 17
    for exporter in ("dynamo", "torchscript"):
        assert default_opset(exporter) == max(17, min(exporter_max_opset(exporter), onnxruntime_max_opset()))
    assert exporter_max_opset("torchscript") <= exporter_max_opset("dynamo")


def test_dynamo_export_keeps_names_and_dynamic_batch(tmp_path):
    res = export(_mlp(), tmp_path / "m.onnx", exporter="dynamo")
    assert res.exporter == "dynamo" and len(res.attempts) == 1 and res.attempts[0].ok
    assert res.opset == default_opset("dynamo")
    model = onnx.load(str(res.path))
    assert [i.name for i in model.graph.input] == ["x"]
    assert [o.name for o in model.graph.output] == ["output"]
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    assert not (tmp_path / "m.onnx.data").exists()


def test_torchscript_export_names_nested_outputs_and_their_dynamic_axes(tmp_path):
    lm = load_model(f"{MODELS}:DictOut", inputs=["x:float32[batch,4]", "mask:int64[batch,3]"])
    res = export(lm, tmp_path / "m.onnx", exporter="torchscript", opset=18)
    assert res.opset == 18
    model = onnx.load(str(res.path))
    outs = {o.name: o for o in model.graph.output}
    assert list(outs) == ["logits", "extra_0", "extra_1"]
    assert outs["logits"].type.tensor_type.shape.dim[0].dim_param == "batch"
    par = compare(lm, res.path, dim_checks=check(res.path, lm.inputs, lm.dims).dynamic_dims)
    assert par.passed and all(d.proven for d in par.dynamic_dims)


def test_auto_goes_past_a_frozen_trace_and_records_every_attempt(tmp_path):
    lm = load_model(f"{MODELS}:NeedsItem", inputs=["x:float32[batch,4]"])
    res = export(lm, tmp_path / "m.onnx")
    assert [a.exporter for a in res.attempts] == ["dynamo", "torchscript", "cond", "script"]
    assert not res.attempts[0].ok and res.attempts[0].error and res.attempts[0].seconds > 0
    assert res.attempts[1].ok and "models.py:55" in res.attempts[1].frozen
    assert not res.attempts[2].ok and res.attempts[2].error  # torch.cond cannot take an .item() predicate
    assert res.attempts[3].ok and not res.attempts[3].frozen and res.exporter == "script"
    assert any(d.code == "tracer-warning" and "models.py" in d.message for d in res.diagnostics)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # the other attempts' files are gone


def test_export_failure_raises_with_all_attempts(tmp_path):
    src = tmp_path / "eig.py"
    src.write_text("import torch\nclass Eig(torch.nn.Module):\n"
                   "    def forward(self, x):\n        return torch.linalg.eigvals(x).real\n")
    lm = load_model(f"{src}:Eig", inputs=["x:float32[batch,3,3]"])
    with pytest.raises(ExportFailed) as info:
        export(lm, tmp_path / "m.onnx")
    assert info.value.exit_code == 3
    assert [a.exporter for a in info.value.attempts] == ["dynamo", "torchscript", "cond", "script"]
    assert "eig" in info.value.attempts[1].error
    assert all(a.not_applicable for a in info.value.attempts[2:])  # no if/for/while to keep
    assert info.value.attempts[2].to_dict()["error"].startswith("not applicable: ")
    assert "cond:" not in info.value.message


def test_external_data_above_threshold(tmp_path):
    lm = load_model(f"{MODELS}:TinyMLP", inputs=["x:float32[batch,8]"], model_args={"hidden": 64})
    res = export(lm, tmp_path / "m.onnx", exporter="torchscript", external_data_threshold=0)
    assert res.external_data
    assert (tmp_path / "m.onnx.data").stat().st_size > 0
    summary = check(res.path, lm.inputs, lm.dims)
    assert summary.ok and summary.bytes > res.path.stat().st_size
    assert compare(lm, res.path, dim_checks=summary.dynamic_dims).passed


def test_bad_exporter_and_opset_are_usage_errors(tmp_path):
    with pytest.raises(UsageError):
        export(_mlp(), tmp_path / "m.onnx", exporter="onnxsim")
    with pytest.raises(UsageError):
        export(_mlp(), tmp_path / "m.onnx", opset=99)


def test_captured_output_swallows_python_and_c_level_output(capfd):
    import os

    with captured_output():
        print("python chatter")
        os.write(1, b"c-level chatter\n")
    print("after")
    assert capfd.readouterr().out == "after\n"


def test_dims_torch_export_refuses_for_a_relation_are_exported_with_auto_and_proven(tmp_path, monkeypatch):
    """torch.export refusing the declared dims (HaloNet: 'Cannot create Dim with inconsistent min=2, max=2', its
    sides at 256, 511, 512) sends the dynamo strategy to export again with Dim.AUTO, said in a note; the file is
    proven at the declared sizes."""
    import torch

    loaded = load_model(f"{FIXTURES}/constrained.py:Windows", inputs=["x:float32[batch,3,height,width]"],
                        dims=["batch=1..3", "height=8,16,24", "width=8,16"])
    real, seen = torch.onnx.export, []

    def refusing(*args, dynamic_shapes=None, **kw):
        auto = all(type(v).__name__ == "_DimHint" for axes in dynamic_shapes or () for v in (axes or {}).values())
        seen.append(auto)
        if not auto:
            raise RuntimeError("Failed to export") from AssertionError("Cannot create Dim with inconsistent "
                                                                        "min=2, max=2")
        return real(*args, dynamic_shapes=dynamic_shapes, **kw)

    monkeypatch.setattr(torch.onnx, "export", refusing)
    res = export(loaded, tmp_path / "m.onnx", exporter="dynamo")
    assert seen == [False, True] and res.exporter == "dynamo" and res.attempts[0].ok
    (note,) = [d for d in res.diagnostics if d.code == "dynamo-dims-auto"]
    assert "Cannot create Dim" in note.message and note.severity == "info"
    assert compare(loaded, res.path).passed


def test_an_auto_retry_past_its_cpu_limit_reports_the_first_refusal(tmp_path, monkeypatch):
    """Swin's padding sends torch.export's shape reasoning into many minutes with Dim.AUTO: the retry stops at its
    CPU limit and the strategy fails with the first refusal, so the chain goes on to the next exporter."""
    import time

    import torch

    from onnxport.core.errors import ExportFailed
    from onnxport.exporters import strategies

    loaded = load_model(f"{FIXTURES}/constrained.py:Windows", inputs=["x:float32[batch,3,height,width]"],
                        dims=["batch=1..3", "height=8,16,24", "width=8,16"])

    def refusing(*args, dynamic_shapes=None, **kw):
        if all(type(v).__name__ == "_DimHint" for axes in dynamic_shapes or () for v in (axes or {}).values()):
            start = time.process_time()
            while time.process_time() - start < 30:  # torch.export thinking; the limit stops it
                pass
            raise AssertionError("the limit did not stop the retry")
        raise RuntimeError("Failed to export") from AssertionError("Cannot create Dim with inconsistent min=2, max=2")

    monkeypatch.setattr(torch.onnx, "export", refusing)
    monkeypatch.setattr(strategies, "AUTO_CPU_LIMIT", 0.5)
    with pytest.raises(ExportFailed) as ei:
        export(loaded, tmp_path / "m.onnx", exporter="dynamo")
    assert "Failed to export" in ei.value.message and "did not stop" not in ei.value.message
    from onnxport.exporters.chain import _dynamo_worth_resizing

    attempts = [a for a in ei.value.attempts if a.exporter == "dynamo"]
    assert strategies.AUTO_OVER_LIMIT in attempts[0].detail  # no dynamo at other sizes to spend it again
    assert not _dynamo_worth_resizing(attempts)


def test_a_dynamo_export_past_its_cpu_limit_goes_on_to_the_next_exporter(tmp_path, monkeypatch):
    """torch.export's shape reasoning can run for many minutes (RAFT: 1,240 s): the dynamo export stops at its CPU
    limit, the TorchScript exporter's file is offered, and no later dynamo attempt spends the limit again."""
    import time

    import torch

    from onnxport.exporters import strategies
    from onnxport.exporters.chain import _dynamo_worth_resizing

    def slow(*args, **kw):  # torch.export thinking, under torch.onnx's own `except Exception`: the limit stops it
        start = time.process_time()
        while time.process_time() - start < 30:
            pass
        raise AssertionError("the limit did not stop the export")

    monkeypatch.setattr(torch.export, "export", slow)
    monkeypatch.setattr(strategies, "DYNAMO_CPU_LIMIT", 0.5)
    loaded = _mlp()
    res = export(loaded, tmp_path / "m.onnx")
    assert res.exporter == "torchscript" and compare(loaded, res.path).passed
    (dynamo,) = [a for a in res.attempts if a.exporter == "dynamo"]
    assert not dynamo.ok and strategies.DYNAMO_OVER_LIMIT in dynamo.error
    assert not _dynamo_worth_resizing(list(res.attempts))
    with pytest.raises(RuntimeError, match="in an earlier attempt"):  # the same model: not spent again
        strategies._export_dynamo(loaded, tmp_path / "again.onnx", 18, False)


def test_cpu_limit_stops_a_busy_block_and_leaves_nothing_behind():
    """No signal is sent to the process (a native thread never sees one), the watchdog is gone and the handler
    is back after the block, and a block that stays under its limit is never interrupted."""
    import signal
    import threading
    import time

    from onnxport.core.signals import OverCpuLimit, cpu_limit

    before = signal.getsignal(signal.SIGXCPU)
    with pytest.raises(OverCpuLimit, match="stopped after 0 CPU seconds"), cpu_limit(0.2):
        start = time.process_time()
        while time.process_time() - start < 10:
            pass
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGXCPU) == before
    assert not [t for t in threading.enumerate() if t.name == "onnxport-cpu-limit"]
    with cpu_limit(5):
        time.sleep(0.3)
    time.sleep(0.3)  # an interruption left on its way would land here


def test_cpu_limit_raises_again_when_a_library_swallows_it(monkeypatch):
    import time

    from onnxport.core import signals

    monkeypatch.setattr(signals, "_AGAIN", 0.2)
    swallowed = 0
    with pytest.raises(signals.OverCpuLimit), signals.cpu_limit(0.2):
        start = time.process_time()
        while time.process_time() - start < 10:
            try:
                while time.process_time() - start < 10:
                    pass
            except signals.OverCpuLimit:
                swallowed += 1
                if swallowed > 1:
                    raise
    assert swallowed == 2


def test_dims_refused_is_a_relation_only():
    from onnxport.exporters.strategies import dims_refused

    relation = RuntimeError("Constraints violated (height)! ...\nSuggested fixes:\n  _height = Dim('_height', "
                            "min=1, max=4)\n  height = 16*_height")
    assert dims_refused(RuntimeError("wrapped")) is None
    wrapped = RuntimeError("Failed to export the model with torch.export")
    wrapped.__cause__ = relation
    assert dims_refused(wrapped).startswith("Constraints violated (height)")
    constant = RuntimeError("Constraints violated (batch)! batch was inferred to be a constant (2).\n"
                            "Suggested fixes:\n  batch = 2")
    assert dims_refused(constant) is None
    assert dims_refused(AssertionError("Cannot create Dim with inconsistent min=2, max=2")).startswith("Cannot")


def test_torchscript_traces_without_autograd_unless_a_fused_module_needs_it(tmp_path):
    """A trace with autograd on keeps every activation for a backward pass (SAM's ViT held 14 GiB): off, unless
    the model has a PyTorch module whose fused inference path runs under no_grad (then on, or that path's
    aten::_transformer_encoder_layer_fwd has no ONNX translation)."""
    import torch
    from torch import nn

    from onnxport.exporters.strategies import trace_grad
    from tests.fixtures.models import TinyText

    seen = []

    class Spy(nn.Module):
        def __init__(self, inner: nn.Module | None = None) -> None:
            super().__init__()
            self.fc, self.inner = nn.Linear(8, 8), inner

        def forward(self, x):
            seen.append(torch.is_grad_enabled())
            return self.fc(x)

    for model, grad in ((Spy(), False), (Spy(nn.MultiheadAttention(8, 2)), True)):
        with trace_grad(model):
            model(torch.ones(1, 8))
        assert seen.pop() is grad
    assert isinstance(trace_grad(TinyText()), torch.enable_grad)
    export(_mlp(), tmp_path / "m.onnx", exporter="torchscript")  # and the export itself still runs
