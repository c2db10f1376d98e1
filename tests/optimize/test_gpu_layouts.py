"""The GPU layout and attention variants without a GPU: fp16-nhwc (an fp16 file of its own, the CUDA provider's
prefer_nhwc) and fp16-sdpa (the fp16 file under the sdpa_kernel option) are built, record their options, are
offered only where a CUDA device is asked for, and a CUDA graph captures them with their options."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxport.api import load_model
from onnxport.core.records import FP16, FP32
from onnxport.exporters.chain import export
from onnxport.optimize import gpu
from onnxport.optimize.context import BuildContext, Skip
from onnxport.optimize.plan import default_plan
from onnxport.optimize.policy import tolerance_policy
from onnxport.runtime import CPU, CUDA, SessionOptions, providers_for, without_cuda_graph

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module")
def cnn():
    return load_model(f"{FIXTURES / 'samples.py'}:TinyCNN", inputs=["image:float32[batch,3,32,32]"],
                      dims=["batch=1..8"])


@pytest.fixture(scope="module")
def cnn_file(cnn, tmp_path_factory) -> Path:
    return export(cnn, tmp_path_factory.mktemp("nhwc") / "model.onnx", exporter="torchscript", opset=17).path


@pytest.fixture(scope="module")
def mlp():
    return load_model(f"{FIXTURES / 'models.py'}:TinyMLP", inputs=["x:float32[batch,8]"], dims=["batch=1..16"])


def _attention_file(path: Path, fused: bool) -> Path:
    """A graph holding onnxruntime's fused Attention op (or a MatMul): what fp16-sdpa looks for."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 4, 8])
    w = helper.make_tensor("w", TensorProto.FLOAT16, [8, 24], np.zeros(8 * 24, np.float16).tolist())
    b = helper.make_tensor("b", TensorProto.FLOAT16, [24], np.zeros(24, np.float16).tolist())
    node = (helper.make_node("Attention", ["x", "w", "b"], ["y"], domain="com.microsoft", num_heads=2) if fused
            else helper.make_node("MatMul", ["x", "w"], ["y"]))
    graph = helper.make_graph([node], "g", [x], [y], [w, b])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)]), path)
    return path


def test_fp16_nhwc_is_an_fp16_file_with_fp32_io_run_with_prefer_nhwc(cnn, cnn_file, tmp_path):
    with pytest.raises(Skip, match="--device cuda"):
        gpu.build_fp16_nhwc(cnn_file, tmp_path / "x.onnx", BuildContext(cnn, out=tmp_path))
    dst = tmp_path / "fp16-nhwc.onnx"
    out = gpu.build_fp16_nhwc(cnn_file, dst, BuildContext(cnn, device="cuda", out=tmp_path))
    o = out.session_options
    assert o == SessionOptions(CUDA, use_tf32=False, prefer_nhwc=True) and out.path is None
    assert o.to_dict() == {"provider": CUDA, "use_tf32": False, "prefer_nhwc": True}
    (_, cuda), cpu = providers_for(o)
    assert cuda["prefer_nhwc"] == "1" and cuda["use_tf32"] == "0" and cpu == CPU and "sdpa_kernel" not in cuda
    assert without_cuda_graph(o) == o and SessionOptions.from_dict({"provider": CUDA, "prefer_nhwc": "1"}) == \
        SessionOptions(CUDA, prefer_nhwc=True)
    model = onnx.load(str(dst))
    io = [v.type.tensor_type.elem_type for v in (*model.graph.input, *model.graph.output)]
    assert io == [TensorProto.FLOAT, TensorProto.FLOAT]  # the contract: fp32 in and out
    casts = [n for n in model.graph.node if n.op_type == "Cast"]
    assert len(casts) == out.details["casts"] == 2  # one after the input, one before the output: nothing else
    convs = {t.name: t.data_type for t in model.graph.initializer if len(t.dims) == 4}
    assert convs and set(convs.values()) == {TensorProto.FLOAT16}
    assert tolerance_policy("fp16-nhwc", FP32)[0] == FP16


def test_fp16_nhwc_needs_a_convolution(mlp, tmp_path):
    src = export(mlp, tmp_path / "mlp.onnx", exporter="torchscript").path
    with pytest.raises(Skip, match="no convolution"):
        gpu.build_fp16_nhwc(src, tmp_path / "x.onnx", BuildContext(mlp, device="cuda", out=tmp_path))


def test_fp16_sdpa_runs_the_fp16_file_with_the_attention_kernels_as_data(mlp, tmp_path):
    ctx = BuildContext(mlp, device="cuda", out=tmp_path)
    fused = _attention_file(tmp_path / "fused.onnx", True)
    with pytest.raises(Skip, match="--device cuda"):
        gpu.build_fp16_sdpa(fused, tmp_path / "x.onnx", BuildContext(mlp, out=tmp_path, passed={"fp16": fused}))
    with pytest.raises(Skip, match="needs the fp16 variant"):
        gpu.build_fp16_sdpa(fused, tmp_path / "x.onnx", ctx)
    plain = _attention_file(tmp_path / "plain.onnx", False)
    with pytest.raises(Skip, match="no fused attention"):
        gpu.build_fp16_sdpa(plain, tmp_path / "x.onnx", BuildContext(mlp, device="cuda", passed={"fp16": plain}))
    out = gpu.build_fp16_sdpa(fused, tmp_path / "x.onnx", BuildContext(mlp, device="cuda", passed={"fp16": fused}))
    bits = gpu.ATTENTION_KERNELS
    assert out.path == fused and out.policy == "fp16"
    assert out.session_options.sdpa_kernel == bits["cudnn-flash"] | bits["flash"] | bits["efficient"] | bits["math"]
    assert providers_for(out.session_options)[0][1]["sdpa_kernel"] == "27"
    assert out.details["attention_kernels"] == list(gpu.SDPA_KERNELS) and gpu.sdpa_bits(("flash",)) == 1


def test_the_layout_and_attention_variants_are_offered_only_on_cuda(cnn, mlp):
    bert = load_model(f"{Path(__file__).resolve().parents[2] / 'benchmarks' / 'gpu.py'}:tiny_bert",
                      inputs=["input_ids:int64[batch,seq]{0..999}", "attention_mask:int64[batch,seq]{1..1}"],
                      dims=["batch=1..4", "seq=1..16"])
    on_cuda = {name: default_plan(m, "cuda", [], providers=[CUDA, CPU]) for name, m in
               (("cnn", cnn), ("mlp", mlp), ("bert", bert))}
    assert "fp16-nhwc" in on_cuda["cnn"].build and "fp16-sdpa" not in on_cuda["cnn"].build
    assert "fp16-sdpa" in on_cuda["bert"].build and "fp16-nhwc" not in on_cuda["bert"].build
    assert not {"fp16-nhwc", "fp16-sdpa"} & set(on_cuda["mlp"].build)
    assert "convolutions" in on_cuda["mlp"].skipped["fp16-nhwc"]
    for m in (cnn, mlp, bert):
        cpu = default_plan(m, "cpu", ["avx2"])
        assert not {"fp16-nhwc", "fp16-sdpa"} & (set(cpu.build) | set(cpu.skipped))


def test_a_cuda_graph_captures_the_fastest_base_with_its_own_options(cnn, cnn_file, tmp_path):
    nhwc = SessionOptions(CUDA, use_tf32=False, prefer_nhwc=True)
    fp16 = tmp_path / "fp16.onnx"
    ctx = BuildContext(cnn, device="cuda", out=tmp_path, options={"fp16-nhwc": nhwc})
    seen: list = []
    out = gpu.build_cuda_graph(cnn_file, tmp_path / "g.onnx", ctx, {"export": cnn_file, "fp16": fp16,
                                                                     "fp16-nhwc": tmp_path / "nhwc.onnx"},
                               fastest=lambda paths: seen.append(sorted(paths)) or "fp16-nhwc",
                               copies=lambda p, chain: seen.append(chain[0][1].get("prefer_nhwc")) or [])
    assert seen == [["export", "fp16", "fp16-nhwc"], "1"]  # the copies are read under its own options
    assert out.path == tmp_path / "nhwc.onnx" and out.policy == "fp16-nhwc"
    o = out.session_options
    assert o.prefer_nhwc and o.enable_cuda_graph and o.io_binding and o.graph_per_shape and o.use_tf32 is False
    cuda = providers_for(o)[0][1]
    assert cuda["prefer_nhwc"] == "1" and cuda["enable_cuda_graph"] == "1"
    assert without_cuda_graph(o) == nhwc  # served with dynamic shapes: the layout stays


def test_the_triton_config_carries_the_layout_and_the_attention_kernels(cnn_file):
    from onnxport.serve.models import signature
    from onnxport.serve.triton import model_config

    sig = signature(cnn_file)
    for options, want in ((SessionOptions(CUDA, use_tf32=False, prefer_nhwc=True), {"prefer_nhwc": "1"}),
                          (SessionOptions(CUDA, use_tf32=False, sdpa_kernel=27), {"sdpa_kernel": "27"})):
        config = model_config(sig, "m", gpu=True, max_batch=8, variant_options=options)
        (cuda,) = config["optimization"]["execution_accelerators"]["gpu_execution_accelerator"]
        assert cuda == {"name": "cuda", "parameters": {"use_tf32": "0", **want}}
