"""Which variants ``convert`` builds by default: only those that can win for this kind of model on this
device, each left-out one recorded with the measurement that rules it out (``--variants all`` builds every
one; ``--variants NAME,…`` exactly those).

The CPU rules, read from the instruction set (``onnxport doctor`` lists it; $ONNXPORT_CPU_FLAGS plans as if the
CPU had other features) and stated as rules, never as one machine's numbers:

* ``slim`` / ``ort``: ONNX Runtime applies the same graph rewrites when it loads the export;
* ``fp16``: ONNX Runtime's CPU provider has fp16 matmul kernels on Arm CPUs with fp16 arithmetic (asimdhp)
  only; on x86 it runs fp16 through Casts, never faster than fp32 (also on AVX512-FP16);
* ``int8`` (ONNX Runtime, dynamic): u8×s8 matmuls; on CPUs with int8 dot products (AVX-512 VNNI, AVX-VNNI,
  AMX-INT8, Arm dot products) with 8-bit weights, on others (AVX2's 16-bit pair sums can saturate) with 7-bit
  weights. Built for every model with MatMul weights; a CNN needs calibration images (``--samples``);
* ``fused`` (fp32 transformer fusion): ONNX Runtime fuses the graph when it loads it; its int8 form
  ``fused+int8`` is built for Hugging Face transformers instead of ``int8``;
* ``openvino`` (f32): built where the CPU has no native bf16; where it has, ``openvino-bf16`` (AVX-512 BF16,
  AMX-BF16) is built instead;
* ``openvino-int8`` (NNCF): only where the CPU has int8 dot products (VNNI / AMX-INT8) and no native bf16: without
  them OpenVINO's int8 kernels have nothing to gain over ONNX Runtime's int8; with native bf16, ``openvino-bf16``
  takes most of the gain with no calibration, which costs more than the default budget.

The default plan runs inside :data:`DEFAULT_BUDGET_S` (``--budget`` sets another): no variant is started after
it, and the searches inside a build (NNCF's SmoothQuant tries, the sensitivity searches) stop at it. The weight
range of ``int8`` is chosen from the instruction set; ``--variants all`` (or naming variants) tries both.

Measured on an H100 (onnxruntime-gpu 1.31.1, TF32 off, IO binding, median ms; benchmarks/gpu.py):

* MiniLM-shaped BERT 1×128: export fp32 1.17, fp16 1.52, fp16 + CUDA graph 0.37 (torch.compile
  reduce-overhead fp16: 0.44); 32×128: 3.60 / 1.68 / 0.91 (0.94). The launch overhead of ~100 small kernels
  dominates at batch 1: the CUDA graph is what wins there.
* resnet18 batch 1: export 1.34, with a CUDA graph 1.22; batch 64: 7.34 (torch.compile fp16: 2.06).
* int8 (dynamic) on the CUDA provider runs slower than fp16; TF32 (``use_tf32=1``) runs fp32 MatMul/Conv on
  the tensor cores at a 10-bit mantissa; TensorRT needs its libraries, which onnxruntime-gpu does not ship.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from onnxport.optimize import openvino as ov_variants
from onnxport.optimize.fusion import transformer_params
from onnxport.optimize.gpu import tensorrt_missing
from onnxport.optimize.result import ALL_VARIANTS, OPENVINO_VARIANTS, VARIANTS, SkipReason
from onnxport.runtime.environment import int8_dot, this_cpu
from onnxport.sources.base import LoadedModel

FP16_FLAGS = ("asimdhp",)  # CPU features onnxruntime's CPU provider has fp16 matmul kernels for (Arm fp16)
DEFAULT_BUDGET_S = 40.0  # seconds the default plan builds and proves variants in (none is started after it)

SAME_AS_LOAD = ("ONNX Runtime applies the same graph rewrites when it loads the export (its default "
                "optimization level), so a file rewritten offline runs no faster")


@dataclass(frozen=True)
class Plan:
    """The variants to build, in order, and why each other one is left out."""

    build: tuple[str, ...]
    skipped: dict[str, str] = field(default_factory=dict)
    cannot: frozenset[str] = frozenset()  # skipped because this machine cannot build or run them

    def reason(self, name: str) -> SkipReason:
        """Why ``name`` is left out, as a :class:`SkipReason`."""
        return SkipReason.NOT_BUILT if name in self.cannot else SkipReason.NOT_PLANNED


def _kind(loaded: LoadedModel) -> str:
    """hf-transformer | attention | cnn | other."""
    params = transformer_params(loaded)
    if params is not None:
        return "hf-transformer" if params.get("found_in") == "config" else "attention"
    images = [s for s in loaded.inputs if s.dtype.startswith("float") and len(s.shape) == 4]
    return "cnn" if images else "other"


def default_plan(loaded: LoadedModel, device: str = "cpu", cpu_flags: Sequence[str] = (),
                 calibrated: bool = False, providers: Sequence[str] | None = None,
                 tensorrt_loadable: bool | None = None) -> Plan:
    """The variants that can win for ``loaded`` on ``device`` (``cpu_flags``: this CPU's features;
    ``calibrated``: the user gave samples, so static int8 of a CNN calibrates on them; ``providers`` and
    ``tensorrt_loadable``: onnxruntime's providers and whether TensorRT's libraries load, None: asked here)."""
    kind = _kind(loaded)
    why: dict[str, str] = {"slim": f"not built by default: {SAME_AS_LOAD}",
                           "ort": f"not built by default: {SAME_AS_LOAD}"}
    if device == "cuda":
        why["int8"] = why["fused+int8"] = ("not built by default: on the CUDA provider int8 (dynamic) runs "
                                           "slower than fp16")
        if kind not in ("hf-transformer",):
            why["fused"] = "not built by default: no Hugging Face attention to fuse"
            why["fp16-sdpa"] = "not built by default: no Hugging Face attention for the fused attention kernels"
        if kind != "cnn":
            why["fp16-nhwc"] = "not built by default: no image input (NHWC is a layout for convolutions)"
        why.update(dict.fromkeys(OPENVINO_VARIANTS, f"not built: {ov_variants.ON_THE_CPU}"))
        no_trt = tensorrt_missing(providers, tensorrt_loadable)
        if no_trt:
            why["tensorrt"] = f"not built: {no_trt}"
        return _plan(why, ALL_VARIANTS, frozenset({"tensorrt"} if no_trt else ()))
    if not any(f in cpu_flags for f in FP16_FLAGS):
        why["fp16"] = ("not built by default: ONNX Runtime's CPU provider has fp16 matmul kernels only on Arm CPUs "
                       "with fp16 arithmetic; here fp16 runs through Casts, no faster than fp32")
    if kind == "hf-transformer":
        why["fused"] = ("not built by default: fp32 fusion is no faster than the export (ONNX Runtime fuses the "
                        "graph when it loads it); its int8 form fused+int8 is built")
        why["int8"] = "not built by default: fused+int8 quantizes the same MatMuls after fusion and runs faster"
    elif kind == "attention":
        why["fused"] = why["fused+int8"] = ("not built by default: ONNX Runtime's transformer fusions match Hugging "
                                            "Face attention graphs, not this model's (nn.MultiheadAttention or "
                                            "hand-written attention)")
    elif kind == "cnn":
        if not calibrated:
            why["int8"] = ("not built by default: static int8 of a CNN needs calibration images (--samples); "
                           "generated inputs are no images, so top-1 on them cannot judge it")
        why["fused"] = why["fused+int8"] = "not built by default: no attention to fuse"
    else:
        why["fused"] = why["fused+int8"] = "not built by default: no attention to fuse"
    cannot = _openvino_plan(why, kind, cpu_flags, calibrated)
    return _plan(why, VARIANTS + OPENVINO_VARIANTS, cannot)


def _openvino_plan(why: dict[str, str], kind: str, cpu_flags: Sequence[str], calibrated: bool) -> frozenset[str]:
    """Add to ``why`` the OpenVINO variants that cannot be built or cannot win here; returns those this machine
    cannot build (OpenVINO, NNCF or native bf16 missing)."""
    cannot = set()
    for name in OPENVINO_VARIANTS:
        found = ov_variants.why_not_here(name, cpu_flags)
        if found:
            why[name] = f"not built: {found[0]}"
            cannot.add(name)
    if "openvino" not in why and "openvino-bf16" not in why:
        why["openvino"] = (f"not built by default: {this_cpu()} has native bf16, so openvino-bf16 is built; OpenVINO at "
                           "f32 computes the same graph at fp32, never faster")
    if "openvino-int8" not in why and kind == "cnn" and not calibrated:
        why["openvino-int8"] = ("not built by default: int8 of a CNN needs calibration images (--samples); "
                                "generated inputs are no images")
    if "openvino-int8" not in why and "openvino-bf16" not in why:
        why["openvino-int8"] = (f"not built by default: {this_cpu()} has native bf16, and openvino-bf16 (no calibration) "
                                "is built; NNCF's calibration and accuracy search cost more than the default "
                                "--budget, for a gain over bf16 that depends on the model")
    if "openvino-int8" not in why and int8_dot(cpu_flags) is None:
        why["openvino-int8"] = (f"not built by default: {this_cpu()} has no int8 dot-product instructions (no AVX-512 "
                                "VNNI, AVX-VNNI or AMX-INT8), so OpenVINO's int8 gains nothing over ONNX Runtime's "
                                "int8 and its calibration costs minutes")
    return frozenset(cannot)


def _plan(why: dict[str, str], names: tuple[str, ...] = VARIANTS, cannot: frozenset[str] = frozenset()) -> Plan:
    """The ``names`` (the GPU variants only on a GPU) not ruled out by ``why`` (``cannot``: those this machine
    cannot build)."""
    def hint(n: str) -> str:
        if n not in OPENVINO_VARIANTS:
            return " (--variants all builds it)"
        return "" if n in cannot else f" (--variants {n} builds it)"

    return Plan(tuple(n for n in names if n not in why), {n: w + hint(n) for n, w in why.items()}, cannot)
