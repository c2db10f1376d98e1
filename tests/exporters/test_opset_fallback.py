"""An opset that runs: when onnxruntime cannot load or run the export at the newest opset, auto goes down."""

from __future__ import annotations

import onnx
import pytest

from tests.conftest import load_report
from tests.fixtures.in_process import run_cli_here


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    path = tmp_path_factory.mktemp("llama") / "tiny"
    transformers.LlamaModel(cfg).save_pretrained(path)  # the base model: no KV-cache path, the plain export
    return path


@pytest.mark.slow
def test_rotary_embedding_refused_at_run_time_falls_back_to_an_opset_that_runs(tiny_llama, tmp_path, monkeypatch,
                                                                             capsys):
    out = tmp_path / "o"
    proc = run_cli_here(monkeypatch, capsys, "export", f"hf:{tiny_llama}", "-d", "seq=1..16", "-o", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rep = load_report(out)
    attempts = rep["export"]["attempts"]
    refused = [a for a in attempts if not a["ok"] and "cannot run the opset-" in (a["error"] or "")]
    kept = [a for a in attempts if a["ok"]]
    assert refused and refused[0]["exporter"] == "dynamo" and "RotaryEmbedding" in refused[0]["error"]
    assert kept and kept[0]["exporter"] == "dynamo" and kept[0]["opset"] < refused[0]["opset"]
    assert "could not run the opset-" in kept[0]["note"]
    model = next(out.glob("model*.onnx"))
    opset = next(o.version for o in onnx.load(model, load_external_data=False).opset_import if o.domain == "")
    assert opset == kept[0]["opset"] == rep["export"]["opset"]
    assert not any("onnxruntime fails" in (c["error"] or "") for c in rep["validation"]["cases"])  # runs everywhere


# --------------------------------------------------------------------------- the opset for the GPU


POOLED = '''
import torch


class Centered(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        return y - y.mean(dim=-1, keepdim=True)
'''


def _opset(path) -> int:
    return next(o.version for o in onnx.load(str(path), load_external_data=False).opset_import if o.domain == "")


def _simulated_gpu(path, *, fixed_below: int | None = 18):
    """A placement as onnxruntime-gpu would log it: ReduceMean on the CPU while its version has no CUDA kernel
    (ReduceMean-18, opsets 18 and newer), every other node on CUDA."""
    from onnxport.runtime.sessions import CPU, CUDA, placement_from
    from tests.runtime.test_placement import GpuSession, ort_log

    nodes = onnx.load(str(path), load_external_data=False).graph.node
    opset = _opset(path)
    on_cpu = [f"{n.op_type} ({n.name})" for n in nodes
              if n.op_type == "ReduceMean" and (fixed_below is None or opset >= fixed_below)]
    on_cuda = [f"{n.op_type} ({n.name})" for n in nodes if f"{n.op_type} ({n.name})" not in on_cpu]
    log = ort_log({CUDA: on_cuda, CPU: on_cpu} if on_cpu else {CUDA: on_cuda})
    return placement_from(GpuSession(), "cuda", [(CUDA, {}), CPU], log)


@pytest.fixture(scope="module")
def centered(tmp_path_factory):
    from onnxport.api import load_model

    source = tmp_path_factory.mktemp("centered") / "centered.py"
    source.write_text(POOLED)
    return load_model(f"{source}:Centered", inputs=["x:float32[batch,8]"])


def test_on_a_gpu_the_export_goes_down_to_the_opset_whose_placement_keeps_compute_on_the_gpu(centered, tmp_path):
    from onnxport.exporters.chain import export
    from onnxport.exporters.opsets import default_opset

    newest = default_opset("torchscript")
    assert newest >= 18
    res = export(centered, tmp_path / "m.onnx", exporter="torchscript", device="cuda", placement_of=_simulated_gpu)
    rejected, kept = res.attempts
    assert not rejected.ok and rejected.opset == newest
    (mean,) = [n.name for n in onnx.load(str(res.path)).graph.node if n.op_type == "ReduceMean"]
    assert rejected.error == (f"opset {newest}: ReduceMean ({mean}) runs on the CPU: this onnxruntime has no "
                              "CUDA kernel for ReduceMean-18")
    assert kept.ok and kept.opset == res.opset == _opset(res.path) == 17  # ReduceMean-13: the one other version
    assert kept.note == f"opset 17: at opset {newest} ReduceMean ran on the CPU"
    assert not list(tmp_path.glob(".*"))  # no trial file left behind
    same = export(centered, tmp_path / "cpu.onnx", exporter="torchscript", device="cpu", placement_of=_simulated_gpu)
    assert same.opset == newest and len(same.attempts) == 1  # on the CPU placement does not choose the opset
    given = export(centered, tmp_path / "o.onnx", exporter="torchscript", opset=19, device="cuda",
                   placement_of=_simulated_gpu)
    assert given.opset == 19 and len(given.attempts) == 1  # the user's opset is kept


def test_when_no_opset_is_better_the_newest_is_kept_with_every_try_recorded(centered, tmp_path):
    from onnxport.exporters.chain import export

    res = export(centered, tmp_path / "m.onnx", exporter="torchscript", device="cuda",
                 placement_of=lambda p: _simulated_gpu(p, fixed_below=None))
    tried, kept = res.attempts
    assert not tried.ok and tried.opset == 17 and tried.error.startswith("opset 17: ReduceMean (")
    assert tried.error.endswith(") runs on the CPU: this onnxruntime has no CUDA kernel for ReduceMean-13")
    assert kept.ok and kept.opset == res.opset == _opset(res.path) > 17
    assert kept.note == f"opset {kept.opset} kept: ReduceMean stay on the CPU (opset 17 did not)"


POOL = '''
import torch


class Pool(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return torch.nn.functional.max_pool2d(self.conv(x).relu(), 2)
'''


@pytest.mark.slow
def test_dynamo_maxpool_22_goes_down_to_opset_21_on_the_gpu(tmp_path):
    """What the H100 showed: at the default opset MaxPool-22 has no CUDA kernel; opset 21 has MaxPool-12."""
    from onnxport.api import load_model
    from onnxport.exporters.chain import export
    from onnxport.exporters.opsets import default_opset, op_version
    from onnxport.runtime.sessions import CPU, CUDA, placement_from
    from tests.runtime.test_placement import GpuSession, ort_log

    if op_version("MaxPool", default_opset("dynamo")) != 22:
        pytest.skip("the default opset here has no MaxPool-22")

    def h100(path):  # onnxruntime-gpu 1.31: no CUDA MaxPool-22, layout reorders around it on the CPU
        nodes = [f"{n.op_type} ({n.name})" for n in onnx.load(str(path)).graph.node]
        pool = [n for n in nodes if n.startswith("MaxPool (")]
        if op_version("MaxPool", _opset(path)) != 22:
            return placement_from(GpuSession(), "cuda", [(CUDA, {}), CPU], ort_log({CUDA: nodes}))
        cpu = ["ReorderInput (ReorderInput_0)", *pool, "ReorderOutput (ReorderOutput_1)"]
        log = ort_log({CUDA: [n for n in nodes if n not in pool] + ["MemcpyToHost (m0)"], CPU: cpu})
        return placement_from(GpuSession(), "cuda", [(CUDA, {}), CPU], log)

    source = tmp_path / "pool.py"
    source.write_text(POOL)
    loaded = load_model(f"{source}:Pool", inputs=["x:float32[batch,3,8,8]"])
    res = export(loaded, tmp_path / "m.onnx", exporter="dynamo", device="cuda", placement_of=h100)
    rejected, kept = res.attempts
    assert rejected.opset == default_opset("dynamo") and "run on the CPU: this onnxruntime has no CUDA kernel for " \
        "MaxPool-22" in rejected.error and rejected.error.startswith(f"opset {rejected.opset}: ReorderInput")
    assert kept.ok and kept.opset == res.opset == _opset(res.path) == 21


def test_an_opset_onnxruntime_cannot_run_goes_down_with_every_refusal_recorded(centered, tmp_path, monkeypatch):
    from onnxport.exporters import chain
    from onnxport.exporters.opsets import default_opset

    real = chain._ort_cannot_run
    monkeypatch.setattr(chain, "_ort_cannot_run", lambda path, loaded, opset: (
        f"onnxruntime cannot run the opset-{opset} export: refused" if opset >= 19 else real(path, loaded, opset)))
    newest = default_opset("torchscript")
    res = chain.export(centered, tmp_path / "m.onnx", exporter="torchscript", device="cpu")
    assert [(a.opset, a.ok) for a in res.attempts] == [(v, False) for v in range(newest, 18, -1)] + [(18, True)]
    assert res.attempts[0].error == f"onnxruntime cannot run the opset-{newest} export: refused"
    assert res.attempts[-1].note == f"opset 18: onnxruntime could not run the opset-{newest} export"
    assert res.opset == _opset(res.path) == 18
