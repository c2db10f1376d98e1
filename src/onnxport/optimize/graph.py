"""fp32-graph variants (``slim``: onnxslim, ``ort``: ONNX Runtime's offline optimization) and the small ONNX
file helpers the other builders share."""

from __future__ import annotations

from pathlib import Path

import onnx

from onnxport.core.onnxfile import copy_model, inline_limit, remove_model, save_model
from onnxport.optimize.context import BuildContext, BuildOutcome, Skip
from onnxport.optimize.result import ORT_LEVEL
from onnxport.prove.check import check
from onnxport.runtime.sessions import write_optimized


def is_cnn(model: onnx.ModelProto) -> bool:
    """At least as many Conv nodes as MatMul/Gemm (and at least one)."""
    op_types = [n.op_type for n in model.graph.node]
    return op_types.count("Conv") >= max(1, op_types.count("MatMul") + op_types.count("Gemm"))


def matmul_weights(model: onnx.ModelProto) -> int:
    """How many MatMul/Gemm nodes have a constant (initializer) second input."""
    inits = {i.name for i in model.graph.initializer}
    return sum(1 for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1
               and n.input[1] in inits)


def init_bytes(model: onnx.ModelProto) -> int:
    """Serialized size of the model's initializers."""
    return sum(t.ByteSize() for t in model.graph.initializer)


def save(model: onnx.ModelProto, path: Path) -> None:
    """Save ``model``, its weights to external data when they exceed :func:`onnxport.core.onnxfile.inline_limit`."""
    save_model(model, path, external=init_bytes(model) > inline_limit())


def replace_model(src: Path, dst: Path) -> None:
    """Copy an ONNX file (and its external data, renamed to ``<dst>.data``) over ``dst``, removing a stale
    ``<dst>.data`` an earlier file left there."""
    remove_model(dst)
    copy_model(src, dst)  # bytes copied, weights never loaded (models over 2 GB)


def relative(path: Path, out: Path) -> str:
    """``path`` relative to ``out`` when inside it, else as given."""
    try:
        return str(path.resolve().relative_to(out.resolve()))
    except ValueError:
        return str(path)


def short_error(e: BaseException) -> str:
    """``Type: message`` on one line, the message cut at 240 characters."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:240]}" if text else type(e).__name__


def file_facts(path: Path) -> dict:
    """``nodes`` and ``bytes`` of an ONNX file for its Variant (None where it cannot be read)."""
    try:
        c = check(path)
        return {"nodes": c.nodes, "bytes": c.bytes}
    except Exception:  # noqa: BLE001
        return {"nodes": None, "bytes": path.stat().st_size if path.exists() else None}


# --------------------------------------------------------------------------- builders


def build_slim(src: Path, dst: Path, ctx: BuildContext) -> BuildOutcome:
    """``slim``: onnxslim's constant folding and graph clean-up."""
    try:
        import onnxslim
    except ImportError as e:
        raise Skip("onnxslim is not installed (pip install onnxslim)") from e
    model = onnxslim.slim(str(src))
    if model is None:
        raise Skip("onnxslim returned no model")
    save(model, dst)
    return BuildOutcome({"tool": f"onnxslim {getattr(onnxslim, '__version__', '')}".strip()})


def build_ort(src: Path, dst: Path, ctx: BuildContext) -> BuildOutcome:
    """``ort``: the graph ONNX Runtime saves after its extended (portable) optimizations."""
    import onnxruntime as ort

    write_optimized(src, dst, opt_level=ORT_LEVEL)  # custom-op libraries / Python implementations loaded
    return BuildOutcome({
        "tool": f"onnxruntime {ort.__version__} offline optimization", "level": ORT_LEVEL, "portable": True,
        "note": "saved at ORT_ENABLE_EXTENDED, which is portable across machines; ORT_ENABLE_ALL adds "
                "hardware-specific layouts (NCHWc) and is applied when the session loads"})
