"""Which variants ``convert`` builds by default: only those that can win for this kind of model on this
device, each left-out one recorded with the measurement that rules it out (``--variants all`` builds every
one; ``--variants NAME,…`` exactly those).

Measured on a 2-core AVX2 CPU without VNNI or native fp16 (benchmarks/optimize_speedup.py, warm-block timing,
batch 1; speedups over PyTorch eager):

* MiniLM (Hugging Face BERT): export 2.82× at seq 16, ``fused+int8`` 5.34× (the winner at 16–128 tokens);
  ``fused`` fp32 no faster than the export (ONNX Runtime fuses the dynamo graph when it loads it);
  ``slim`` / ``ort`` equal to the export.
* TextClassifier (nn.MultiheadAttention, not a Hugging Face model): export 2.50×, ``int8`` (7-bit weights)
  4.18× (the winner); ``fused`` slower than the export (14.2 vs 13.3 ms at seq 128).
* resnet18: the export wins (1.9–2.1×); ``ort`` was picked once by noise and was slower when confirmed;
  static ``int8`` fails the top-1 check on generated inputs (0.82) without calibration images.
* fp16 on a CPU without native fp16 arithmetic runs through casts: slower than fp32.

Measured on a 2-core AMD EPYC with AVX-512 VNNI and AVX-512 BF16 (benchmarks/cpu_race.py, p50 ms, batch 1):
OpenVINO's default on the export (bf16 on this CPU) ties or beats the best ONNX Runtime variant on MiniLM and the
TextClassifier at 1×128 (TextClassifier 5.20 vs 6.09 ms) and runs resnet18 2× faster at bf16. So on a CPU with
OpenVINO installed ``openvino`` (f32) is built, ``openvino-bf16`` where the CPU has AVX-512 BF16 or AMX-BF16 (else
it runs bf16 through conversions), and ``openvino-int8`` (NNCF) beside ``int8`` where the model has MatMul/Conv
weights and NNCF is installed; each is re-proven and timed like every variant.

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
from onnxport.sources.base import LoadedModel

FP16_FLAGS = ("avx512_fp16", "amx_fp16")  # CPU features with native fp16 arithmetic

SAME_AS_LOAD = ("ONNX Runtime applies the same graph rewrites when it loads the export, so it runs no faster "
                "(measured equal on MiniLM, the TextClassifier and resnet18)")


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
        why.update(dict.fromkeys(OPENVINO_VARIANTS, f"not built: {ov_variants.ON_THE_CPU}"))
        no_trt = tensorrt_missing(providers, tensorrt_loadable)
        if no_trt:
            why["tensorrt"] = f"not built: {no_trt}"
        return _plan(why, ALL_VARIANTS, frozenset({"tensorrt"} if no_trt else ()))
    if not any(f in cpu_flags for f in FP16_FLAGS):
        why["fp16"] = ("not built by default: this CPU has no native fp16 arithmetic (no AVX512-FP16/AMX-FP16), "
                       "so fp16 runs through casts, slower than fp32")
    if kind == "hf-transformer":
        why["fused"] = ("not built by default: fp32 fusion is no faster than the export (ONNX Runtime fuses the "
                        "graph when it loads it); its int8 form fused+int8 is built")
        why["int8"] = "not built by default: fused+int8 quantizes the same MatMuls after fusion and runs faster"
    elif kind == "attention":
        why["fused"] = why["fused+int8"] = ("not built by default: ONNX Runtime's fusion does not match "
                                            "nn.MultiheadAttention's graph (measured slower than the export)")
    elif kind == "cnn":
        if not calibrated:
            why["int8"] = ("not built by default: static int8 of a CNN needs calibration images (--samples); on "
                           "generated inputs it fails the top-1 check (resnet18: 0.82)")
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
    if "openvino-int8" not in why and kind == "cnn" and not calibrated:
        why["openvino-int8"] = ("not built by default: int8 of a CNN needs calibration images (--samples); "
                                "generated inputs are no images")
    return frozenset(cannot)


def _plan(why: dict[str, str], names: tuple[str, ...] = VARIANTS, cannot: frozenset[str] = frozenset()) -> Plan:
    """The ``names`` (the GPU variants only on a GPU) not ruled out by ``why`` (``cannot``: those this machine
    cannot build)."""
    def hint(n: str) -> str:
        if n not in OPENVINO_VARIANTS:
            return " (--variants all builds it)"
        return "" if n in cannot else f" (--variants {n} builds it)"

    return Plan(tuple(n for n in names if n not in why), {n: w + hint(n) for n, w in why.items()}, cannot)
