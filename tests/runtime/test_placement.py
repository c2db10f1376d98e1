"""Placement on a GPU, without a GPU: compute nodes on the CPU told from shape nodes, Memcpy nodes counted,
the opset decision and the placement diagnostics, from logs in ONNX Runtime's own format (what
onnxruntime-gpu writes for resnet18 at opset 23, where MaxPool-22 has no CUDA kernel)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from onnxport import runtime
from onnxport.core.errors import UsageError
from onnxport.core.records import Attempt, ExportResult
from onnxport.diagnose import explain
from onnxport.exporters.opsets import candidate_opsets, lower_opsets, placement_problem
from onnxport.runtime.placement import classify, forced_to_cpu, shape_node_names
from onnxport.runtime.sessions import CPU, CUDA, TENSORRT

_V = "2026-11-23 10:00:00.000 [V:onnxruntime:, session_state.cc:1154 VerifyEachNodeIsAssignedToAnEp]"
_I = "2026-11-23 10:00:00.000 [I:onnxruntime:Default, fallback_cpu_capability.cc:143 GetCpuPreferredNodes]"


def ort_log(placed: dict[str, list[str]], forced: tuple[str, ...] = ()) -> str:
    """A verbose session log as ONNX Runtime writes it: the CPU-preferred lines, then the node placements."""
    lines = [f"{_I} ORT optimization- Force fallback to CPU execution for node: {name} because the CPU "
             "execution path is deemed faster than overhead involved with execution on other EPs  capable of "
             "executing this node" for name in forced]
    lines.append(f"{_V} Node placements")
    if len(placed) == 1:
        (provider, nodes), = placed.items()
        lines.append(f"{_V}  All nodes placed on [{provider}]. Number of nodes: {len(nodes)}")
    else:
        for provider, nodes in placed.items():
            lines.append(f"{_V}  Node(s) placed on [{provider}]. Number of nodes: {len(nodes)}")
            lines += [f"{_V}   {node}" for node in nodes]
    lines.append("2026-11-23 10:00:00.100 [I:onnxruntime:, inference_session.cc:2090 Initialize] Session "
                 "successfully initialized.")
    return "\n".join(lines) + "\n"


class GpuSession:
    """What onnxruntime-gpu's session reports for its providers."""

    def __init__(self, providers=(CUDA, CPU)):
        self.providers = list(providers)

    def get_providers(self):
        return self.providers


CONVS = [f"FusedConv (/layer{i}/conv/Conv)" for i in range(4)] + ["Conv (/conv1/Conv)", "Gemm (/fc/Gemm)"]
SHAPE = ["Shape (/Shape)", "Gather (/Gather)", "Unsqueeze (/Unsqueeze)", "Concat (/Concat)", "Reshape (/Reshape)"]
RESNET_23 = ort_log({
    CUDA: [*CONVS, "MemcpyToHost (Memcpy_token_0)", "MemcpyFromHost (Memcpy_token_1)"],
    CPU: ["ReorderInput (ReorderInput_0)", "MaxPool (/maxpool/MaxPool)", "ReorderOutput (ReorderOutput_1)", *SHAPE],
}, forced=("/Gather", "/Unsqueeze", "/Concat", "/Reshape"))
RESNET_21 = ort_log({CUDA: CONVS + ["MaxPool (/maxpool/MaxPool)"], CPU: SHAPE},
                   forced=("/Gather", "/Unsqueeze", "/Concat", "/Reshape"))


def _placed(log: str, providers=(CUDA, CPU), **kw) -> runtime.Placement:
    return runtime.placement_from(GpuSession(providers), "cuda", [(CUDA, {}), CPU], log, **kw)


def test_compute_nodes_on_the_cpu_are_told_from_shape_nodes_and_memcpy_counted():
    placed = _placed(RESNET_23)
    assert placed.cpu_compute_nodes == ("ReorderInput (ReorderInput_0)", "MaxPool (/maxpool/MaxPool)",
                                        "ReorderOutput (ReorderOutput_1)")
    assert placed.cpu_shape_nodes == tuple(SHAPE)
    assert placed.memcpy_nodes == 2
    assert placed.cpu_fallback_nodes == placed.cpu_compute_nodes + tuple(SHAPE)  # the old key: every CPU node
    assert placed.compute_op_types == ("ReorderInput", "MaxPool", "ReorderOutput")
    d = placed.to_dict()
    assert d["cpu_compute_nodes"][1] == "MaxPool (/maxpool/MaxPool)" and d["memcpy_nodes"] == 2
    assert d["cpu_shape_nodes"] == SHAPE and d["nodes_per_provider"] == {CUDA: 8, CPU: 8}
    assert set(d) >= {"device", "providers_requested", "providers_used", "nodes_per_provider", "cpu_fallback_nodes"}
    clean = _placed(RESNET_21)
    assert clean.cpu_compute_nodes == () and clean.cpu_shape_nodes == tuple(SHAPE) and clean.memcpy_nodes == 0
    assert forced_to_cpu(RESNET_23) == {"/Gather", "/Unsqueeze", "/Concat", "/Reshape"}


def test_the_graph_tells_a_gather_on_shapes_from_a_gather_on_data():
    """Gather on the output of Shape is shape work; Gather of an embedding table is compute."""
    nodes = [helper.make_node("Shape", ["ids"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "zero"], ["n"], name="pick_dim"),
             helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="unsq"),
             helper.make_node("Mul", ["n1", "two"], ["n2"], name="double_dim"),
             helper.make_node("Gather", ["table", "ids"], ["emb"], name="embed"),
             helper.make_node("Mul", ["emb", "twof"], ["y"], name="scale")]
    inits = [helper.make_tensor("zero", TensorProto.INT64, [], [0]),
             helper.make_tensor("axes", TensorProto.INT64, [1], [0]),
             helper.make_tensor("two", TensorProto.INT64, [1], [2]),
             helper.make_tensor("twof", TensorProto.FLOAT, [], [2.0]),
             helper.make_tensor("table", TensorProto.FLOAT, [10, 4], [0.0] * 40)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4]),
                               helper.make_tensor_value_info("n2", TensorProto.INT64, [1])], inits)
    assert shape_node_names(graph) == {"shape", "pick_dim", "unsq", "double_dim"}
    on_cpu = ["Shape (shape)", "Gather (pick_dim)", "Mul (double_dim)", "Gather (embed)", "Mul (scale)",
              "Cast (renamed_by_the_optimizer)"]
    compute, shape = classify(on_cpu, "", graph)
    assert compute == ("Gather (embed)", "Mul (scale)")
    assert shape == ("Shape (shape)", "Gather (pick_dim)", "Mul (double_dim)", "Cast (renamed_by_the_optimizer)")
    assert classify(on_cpu) == (("Mul (double_dim)", "Mul (scale)"),  # by op type alone: Gather is shape work
                                ("Shape (shape)", "Gather (pick_dim)", "Gather (embed)",
                                 "Cast (renamed_by_the_optimizer)"))


def test_the_opset_decision_from_the_placement():
    placed = _placed(RESNET_23)
    assert placement_problem(placed, 23) == (
        "opset 23: ReorderInput (ReorderInput_0), MaxPool (/maxpool/MaxPool), ReorderOutput (ReorderOutput_1) run "
        "on the CPU: this onnxruntime has no CUDA kernel for MaxPool-22")
    assert candidate_opsets(23, placed.compute_op_types) == [21]  # MaxPool-12 from 21 down to 17: one try
    assert placement_problem(_placed(RESNET_21), 21) is None
    assert placement_problem(None, 23) is None
    only_maxpool = _placed(ort_log({CUDA: CONVS, CPU: ["MaxPool (maxpool_1)"]}))
    assert placement_problem(only_maxpool, 23) == ("opset 23: MaxPool (maxpool_1) runs on the CPU: this "
                                                   "onnxruntime has no CUDA kernel for MaxPool-22")
    nothing_on_gpu = _placed(ort_log({CPU: CONVS}), providers=(CPU,))
    assert nothing_on_gpu.cpu_compute_nodes == ("all 6 nodes",)
    assert placement_problem(nothing_on_gpu, 23) == "opset 23: all 6 nodes runs on the CPU: the session uses no GPU provider"
    assert candidate_opsets(23, ["NonMaxSuppression", "ReorderInput"]) == []  # no opset changes them


def test_lower_opsets_keeps_the_first_good_one_and_records_the_rejected():
    made: list[int] = []

    def build(v):
        made.append(v)
        return f"export@{v}"

    kept, rejected = lower_opsets([22, 21, 20], build, lambda v, m: None if v == 21 else f"opset {v}: bad")
    assert kept == (21, "export@21") and rejected == [(22, "export@22", "opset 22: bad")] and made == [22, 21]
    kept, rejected = lower_opsets([22, 21], build, lambda v, m: f"opset {v}: bad")
    assert kept is None and [r[0] for r in rejected] == [22, 21]
    kept, rejected = lower_opsets([22, 21], lambda v: None, lambda v, m: None)  # the export fails: stop
    assert kept is None and rejected == []


def test_placement_diagnostics_name_the_ops_and_the_fix():
    def never(name):
        return False

    placed = _placed(RESNET_23, available=[TENSORRT, CUDA, CPU], probe=never)
    assert len(placed.providers_unloadable) == 1 and "libnvinfer.so.10" in placed.providers_unloadable[0]
    result = ExportResult("m.onnx", "dynamo", 23, 1.0, (Attempt("dynamo", True, 1.0, 23),), False)
    diags = explain.placement(placed, result)
    assert [(d.severity, d.code) for d in diags] == [("warning", "provider-unloadable"), ("warning", "cpu-compute-node")]
    cpu = diags[1]
    assert cpu.message.startswith("3 compute node(s) run on the CPU under --device cuda (ReorderInput, MaxPool, "
                                  "ReorderOutput): ReorderInput (ReorderInput_0), MaxPool (/maxpool/MaxPool)")
    assert "2 Memcpy node(s)" in cpu.message and cpu.node == "ReorderInput_0"
    assert cpu.hint.startswith("export with --opset 21")
    tried = ExportResult("m.onnx", "dynamo", 23, 1.0, (Attempt("dynamo", False, 1.0, 21, "opset 21: MaxPool (m) runs "
                                                               "on the CPU"), Attempt("dynamo", True, 1.0, 23)), False)
    hint = explain.placement(placed, tried)[1].hint
    assert "no kernel for ReorderInput, MaxPool-22, ReorderOutput (opset 21 left them there too)" in hint
    assert explain.placement(_placed(RESNET_21), result) == []
    assert explain.placement(runtime.placement_from(GpuSession([CPU]), "cpu", [CPU], ""), result) == []


# --------------------------------------------------------------------------- verbose logging stays in the sink


@pytest.fixture(scope="module")
def pool_onnx(tmp_path_factory):
    """A model whose runs log verbosely (memory pattern misses) when its session logs verbosely."""
    path = tmp_path_factory.mktemp("placement") / "pool.onnx"

    class Pool(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.max_pool2d(x.relu(), 2) * 2

    torch.onnx.export(Pool(), (torch.randn(1, 3, 8, 8),), str(path), dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {2: "h", 3: "w"}})
    return path


def test_a_session_made_with_verbose_logging_runs_quietly(pool_onnx, capfd):
    log: list[str] = []
    sess = runtime.session(pool_onnx, log_sink=log)
    placed = runtime.placement(pool_onnx, "cpu")
    for size in (8, 16, 12):  # new shapes: a verbose session logs memory-pattern misses on every run
        sess.run(None, {"x": np.ones((1, 3, size, size), np.float32)})
    out, err = capfd.readouterr()
    assert "[V:onnxruntime" in "".join(log) and "Node placements" in "".join(log)
    assert "[V:onnxruntime" not in out + err and out == ""
    assert placed.nodes_per_provider


def test_the_verbose_severity_is_restored_when_the_session_fails(pool_onnx, tmp_path, capfd):
    import onnxruntime as ort

    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    with pytest.raises(UsageError, match="onnxruntime cannot load broken.onnx"):
        runtime.session(broken, log_sink=[])
    capfd.readouterr()
    ort.InferenceSession(str(pool_onnx), providers=[CPU])  # the default logger's severity: no verbose lines
    out, err = capfd.readouterr()
    assert "[V:onnxruntime" not in out + err and "[I:onnxruntime" not in out + err


def test_what_onnxruntime_prints_while_creating_a_session_never_reaches_stdout(pool_onnx, capfd, monkeypatch):
    import onnxruntime as ort

    init = ort.InferenceSession.__init__

    def noisy(self, *a, **k):  # onnxruntime's Python fallback prints its "EP Error" block with print()
        print("*************** EP Error ***************")
        init(self, *a, **k)

    monkeypatch.setattr(ort.InferenceSession, "__init__", noisy)
    gpu_chain = [(CUDA, {"device_id": 0}), CPU]  # this build lacks CUDA: onnxruntime warns and runs on the CPU
    sink: list[str] = []
    with pytest.warns(UserWarning, match="not in available provider names"):
        runtime.session(pool_onnx, providers=gpu_chain)
        runtime.session(pool_onnx, providers=gpu_chain, log_sink=sink)
    out, err = capfd.readouterr()
    assert "EP Error" not in out and "EP Error" in err and "EP Error" in "".join(sink)
