"""The ``fused`` variant: ONNX Runtime's transformer fusions (Attention, SkipLayerNormalization, BiasGelu,
EmbedLayerNormalization...), on the given export or on a re-export whose graph the fusion patterns know."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import onnx

from onnxport.exporters.chain import export as run_export
from onnxport.optimize.context import BuildContext, BuildOutcome, Skip
from onnxport.optimize.graph import replace_model, save, short_error
from onnxport.prove.parity import compare
from onnxport.sources.base import LoadedModel

ATTENTION_OPS = ("Attention", "MultiHeadAttention", "PackedAttention", "QAttention")
FUSION_OPSET = 18  # below 23: no standard Attention op, so ONNX Runtime's attention fusions can match

Fused = tuple[onnx.ModelProto, dict[str, int], str]  # the fused model, fusion counts, the tool that fused it


def transformer_params(loaded: LoadedModel) -> dict | None:
    """num_heads / hidden_size / model_type of a transformer, read from its modules; None otherwise."""
    import torch

    model = loaded.model
    config = getattr(model, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    if heads and hidden:
        mtype = getattr(config, "model_type", None) or "bert"
        return {"num_heads": int(heads), "hidden_size": int(hidden),
                "model_type": mtype if mtype in ("bert", "gpt2", "bart", "t5", "vit", "clip") else "bert",
                "found_in": "config"}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.MultiheadAttention):
            return {"num_heads": int(m.num_heads), "hidden_size": int(m.embed_dim), "model_type": "bert",
                    "found_in": name or "model"}
    return None


def fused_attention(model: onnx.ModelProto) -> int:
    """How many of ONNX Runtime's fused attention ops (com.microsoft domain) ``model`` has."""
    return sum(1 for n in model.graph.node if n.domain == "com.microsoft" and n.op_type in ATTENTION_OPS)


def _fuse_onnxscript(src: Path) -> Fused:
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model_ir, raw = optimize_for_ort(ir.load(str(src)))
    return (ir.serde.serialize_model(model_ir), {k: int(v) for k, v in raw.items() if v},
            "onnxscript.rewriter.ort_fusions.optimize_for_ort")


def ort_optimizer(src: Path, params: dict, *, use_gpu: bool = False):
    """onnxruntime's transformer optimizer on ``src`` (``params``: model_type, num_heads, hidden_size), with the
    raw attention mask kept: (the optimizer's model, {fused op: count} for the ops it fused)."""
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    options = FusionOptions(params["model_type"])
    options.use_raw_attention_mask(True)  # a 1-D mask index changes rows whose mask is all zeros
    opt = optimizer.optimize_model(str(src), model_type=params["model_type"], num_heads=params["num_heads"],
                                   hidden_size=params["hidden_size"], opt_level=0, use_gpu=use_gpu,
                                   optimization_options=options)
    return opt, {k: int(v) for k, v in (opt.get_fused_operator_statistics() or {}).items() if v}


def _fuse_ort(src: Path, params: dict) -> Fused:
    opt, fused = ort_optimizer(src, params)
    if fused.get("Attention") and not fused_attention(opt.model):  # it counts the standard op too
        fused.pop("Attention")
    have = {o.domain for o in opt.model.opset_import}
    for domain in sorted({n.domain for n in opt.model.graph.node} - have - {"", "ai.onnx"}):
        opt.model.opset_import.append(onnx.helper.make_opsetid(domain, 1))  # save_model_to_file would add it
    return opt.model, fused, "onnxruntime.transformers.optimizer (model_type, heads, hidden from the modules)"


@contextlib.contextmanager
def _eager_attention(model) -> Iterator[bool]:
    """Hugging Face models with the plain (eager) attention, whose graph ONNX Runtime's fusions recognize."""
    setter = getattr(model, "set_attn_implementation", None)
    config = getattr(model, "config", None)
    before = getattr(config, "_attn_implementation", None)
    if setter is None or before in (None, "eager"):
        yield False
        return
    setter("eager")
    try:
        yield True
    finally:
        setter(before)


def _reexport(loaded: LoadedModel, dst: Path, exporter: str, opset: int) -> str:
    with _eager_attention(loaded.model) as eager:
        result = run_export(loaded, dst, exporter=exporter, opset=opset)
    return f"{exporter} re-export at opset {result.opset}" + (" with eager attention" if eager else "")


def _fusion_candidates(src: Path, ctx: BuildContext, tmp: Path) -> Iterator[tuple[str, Callable[[], Fused]]]:
    """(label, fuse) pairs, cheapest first: the given file, then re-exports whose graphs the fusions know."""
    params = ctx.transformer or {}
    loaded = ctx.loaded
    yield "given export", lambda: _fuse_onnxscript(src)
    yield "given export", lambda: _fuse_ort(src, params)
    if params.get("found_in") == "config":  # Hugging Face: the TorchScript graph of eager attention
        def ts() -> Fused:
            p = tmp / "torchscript.onnx"
            how = _reexport(loaded, p, "torchscript", min(FUSION_OPSET, 17))
            model, counts, tool = _fuse_ort(p, params)
            return model, counts, f"{tool}; {how}"
        yield "torchscript re-export", ts

    def dyn() -> Fused:
        p = tmp / "dynamo.onnx"
        how = _reexport(loaded, p, "dynamo", FUSION_OPSET)
        model, counts, tool = _fuse_onnxscript(p)
        return model, counts, f"{tool}; {how}"
    yield "dynamo re-export", dyn


def _quick_parity(path: Path, ctx: BuildContext) -> str | None:
    """None when ``path`` matches PyTorch on the two cheap cases of other shapes, else why not."""
    refs = ctx.refs
    if refs is None:
        return None
    cases = [c for c in refs.cases if c.label in ("min", "odd")] or list(refs.cases[:1])
    result = compare(ctx.loaded, path, cases=cases, tolerance=ctx.tolerance)
    if result.passed:
        return None
    bad = next(c for c in result.cases if not c.passed)
    return f"case '{bad.label}': {bad.error or f'max abs err {bad.max_abs_err:.3g}'}"


def build_fused(src: Path, dst: Path, ctx: BuildContext) -> BuildOutcome:
    """``fused``: transformer fusions (Attention, SkipLayerNormalization, BiasGelu, EmbedLayerNormalization...).

    The given export is fused first; when no attention fused there, the model is re-exported in a form
    the fusion patterns were written for (TorchScript with eager attention for Hugging Face models, dynamo
    below opset 23 otherwise) and that graph is fused. A re-export must match PyTorch on the min and odd
    cases before it is kept; the variant is then re-proven on the whole matrix like every other.
    """
    params = ctx.transformer
    if not params:
        raise Skip("not a transformer (no nn.MultiheadAttention or Hugging Face attention config found)")
    details: dict = {"num_heads": params["num_heads"], "hidden_size": params["hidden_size"],
                     "model_type": params["model_type"], "params_from": params["found_in"]}
    tried: list[str] = []
    fallback: Fused | None = None
    with tempfile.TemporaryDirectory(prefix="onnxport-fuse-", dir=dst.parent) as tmp_dir:
        tmp = Path(tmp_dir)
        for label, fuse in _fusion_candidates(src, ctx, tmp):
            try:
                model, counts, tool = fuse()
            except Exception as e:  # noqa: BLE001 - one fusion route failing leaves the others
                tried.append(f"{label}: {short_error(e)}")
                continue
            if not counts:
                tried.append(f"{label} ({tool.split(' ')[0]}): no fusion matched")
                continue
            if not fused_attention(model):
                tried.append(f"{label} ({tool.split(' ')[0]}): {sum(counts.values())} fusions, no attention")
                if fallback is None:
                    fallback = (model, counts, tool)
                continue
            cand = tmp / "candidate.onnx"
            save(model, cand)
            why = None if label == "given export" else _quick_parity(cand, ctx)
            if why:
                tried.append(f"{label}: attention fused but {why}")
                continue
            replace_model(cand, dst)
            details.update(tool=tool, fusions=counts, graph=label, tried=tried)
            return BuildOutcome(details)
    if fallback is None:
        raise Skip("no transformer fusion matched this graph (" + "; ".join(tried) + ")")
    model, counts, tool = fallback
    save(model, dst)
    details.update(tool=tool, fusions=counts, graph="given export", tried=tried)
    return BuildOutcome(details)
