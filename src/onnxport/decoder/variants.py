"""Optimized variants of a proven decoder file: ``export`` (the file itself), ``fused`` (graph fusions) and
``int8`` / ``int4`` (weight-only MatMulNBits), each re-proven against PyTorch and timed; the best is the
fastest passing one.

The builders (``fused``, ``int8``, ``int4``) and the judge are registered in the one variant registry
(:mod:`onnxport.optimize.registry`, kind ``decoder``); building, the budget, the choice and best.onnx are
:mod:`onnxport.optimize.passes`', the gates :data:`onnxport.optimize.gates.GATES`.

fp32 variants must stay within the proof's fp32 tolerance on every step case. Quantized ones are judged by the
lowest logit cosine over the step cases and by teacher-forced top-1 agreement (PyTorch's greedy tokens fed in,
the variant's argmax compared at each step): random-weight models have flat logits, so asking for equal greedy
tokens would judge noise. Greedy agreement (steps before the first difference) is recorded for information."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from onnxport.core.greedy import PLAIN
from onnxport.core.logs import Progress, captured_output, noop
from onnxport.core.onnxfile import file_bytes, inline_limit, move_model, save_model
from onnxport.core.records import FP32, Tolerance
from onnxport.decoder.attention import Rotary, rotary_tables
from onnxport.decoder.generation import past_dtype, shares_buffer, step_feeds, stream_bound
from onnxport.decoder.kind import DECODER, DECODER_VARIANTS
from onnxport.decoder.layout import CachedDecoder, step_inputs
from onnxport.decoder.prove import greedy, step_matrix
from onnxport.decoder.records import (
    DECODER_GATES,
    CacheLayout,
    CacheVariants,
    DecoderVariant,
    DecoderVariants,
)
from onnxport.optimize import registry
from onnxport.optimize.context import BuildOutcome, Skip
from onnxport.optimize.graph import short_error
from onnxport.optimize.passes import Budget, Unmade, VariantPass, build_into, each_variant
from onnxport.optimize.registry import BASELINE, register, register_judge
from onnxport.optimize.result import SkipReason
from onnxport.prove.judging import (
    Policy,
    RunResults,
    compare_accuracy,
    run_cases,
    token_agreement,
    varying_record,
    verdict,
)
from onnxport.prove.references import Refs, run_over
from onnxport.runtime.binding import CPU_TARGET, Target
from onnxport.runtime.sessions import write_optimized
from onnxport.runtime.variant_sessions import SessionOptions

VARIANT_NAMES = (BASELINE, *DECODER_VARIANTS)
FP32_VARIANTS = (BASELINE, "fused", "gqa")
COSINE_MIN = DECODER_GATES.cosine_min  # lowest logit cosine over the step cases
TOP1_MIN = DECODER_GATES.top1_min  # teacher-forced top-1 agreement
BLOCK_SIZE = 32  # MatMulNBits block (symmetric)
ACCURACY_LEVEL = 4  # MatMulNBits computes with int8 activations: the fast CPU kernels
JUDGE_TOKENS = 16
SPEED_PROMPT = 8
SPEED_TOKENS = 16
REPEATS = 3
# op types a fusion or quantization leaves (the dynamo exporter already writes the ONNX ones at opset 23)
FUSED_ONNX_OPS = frozenset({"Attention", "RotaryEmbedding", "RMSNormalization", "LayerNormalization"})
# onnxruntime.transformers.optimizer model types by Hugging Face model_type; others try "gpt2" (a decoder)
ORT_MODEL_TYPES = {"gpt2": "gpt2", "gpt_neox": "gpt_neox", "phi": "phi", "qwen3": "qwen3"}
QUANT_LOGGER = "onnxruntime.quantization.matmul_nbits_quantizer"


# --------------------------------------------------------------------------- references and judging


@dataclass(frozen=True)
class References:
    """What PyTorch gives, computed once for every variant: the step cases (``steps``: feeds and outputs, the
    cases labelled (batch, past, new)) and greedy tokens for two prompts."""

    steps: Refs
    prompts: np.ndarray  # [rows, prompt]
    tokens: np.ndarray  # [rows, new]: PyTorch's greedy tokens


def references(model: nn.Module, layout: CacheLayout, *, tokens: int = JUDGE_TOKENS, seed: int = 0) -> References:
    """PyTorch's outputs on every :func:`step_matrix` case and its greedy tokens for two random prompts, both
    by :func:`onnxport.prove.references.run_over` (a step case PyTorch fails on is a UsageError: nothing to
    judge against)."""
    wrapper = CachedDecoder(model, layout).eval()
    cases = tuple(step_matrix(layout.max_length))
    feeds = tuple(step_inputs(layout, batch=b, past=p, new=n, seed=seed + i) for i, (b, p, n) in enumerate(cases))
    tokens = max(1, min(tokens, layout.max_length - 1))
    prompt = max(1, min(SPEED_PROMPT, layout.max_length - tokens))
    ids = torch.randint(0, max(layout.vocab, 1), (2, prompt), generator=torch.Generator().manual_seed(seed + 100))
    outs = run_over(wrapper, feeds)
    (greedy_tokens,) = run_over(functools.partial(torch_greedy, model, layout, new_tokens=tokens), [(ids,)])
    if greedy_tokens is None or any(o is None for o in outs):
        raise RuntimeError("PyTorch fails on the decoder's step cases or greedy loop")
    return References(Refs(cases, feeds, outs), ids.numpy(), greedy_tokens[0])


def torch_greedy(model: nn.Module, layout: CacheLayout, input_ids: torch.Tensor, new_tokens: int,
                 seconds: list[float] | None = None) -> np.ndarray:
    """PyTorch's greedy tokens [rows, new_tokens] by the same loop as :func:`greedy` (its DynamicCache kept, one
    token per step), never stopping at an end-of-sequence token; each step's seconds go to ``seconds``."""
    from transformers import DynamicCache

    ids, cache, tokens = input_ids, DynamicCache(), []
    mask = torch.ones_like(input_ids)
    with torch.inference_mode():
        for _ in range(new_tokens):
            t0 = time.perf_counter()
            extra = {"position_ids": mask.cumsum(-1)[:, -ids.shape[1]:] - 1} if layout.position_ids else {}
            out = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True, **extra)
            ids = out.logits[:, -1].argmax(-1, keepdim=True)
            cache = out.past_key_values
            tokens.append(ids)
            if seconds is not None:
                seconds.append(time.perf_counter() - t0)
            mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
    return torch.cat(tokens, dim=1).numpy()


def step_runs(sess, layout: CacheLayout, refs: References) -> RunResults:
    """The variant's outputs (logits, then every present) on each step case: the run the judge compares."""
    cache = past_dtype(sess)  # a float16 cache is fed the references' float32 values as float16
    return run_cases(lambda feeds: sess.run(list(layout.output_names), {
        name: t.numpy().astype(cache) if name.startswith("past_key_values.") else t.numpy()
        for name, t in zip(layout.input_names, feeds)}), refs.steps.inputs, refs.steps.cases)


def teacher_forced(sess, layout: CacheLayout, prompts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """The variant's argmax [rows, steps] at each step when the reference tokens (not its own) are fed back, the
    presents kept as the cache (compared with the reference tokens: teacher-forced top-1)."""
    rows = prompts.shape[0]
    ids, mask = prompts.astype(np.int64), np.ones(prompts.shape, np.int64)
    past = [np.zeros(layout.past_shape(kind, rows, 0), past_dtype(sess)) for _ in range(layout.layers)
            for kind in ("key", "value")]
    picked = []
    for t in range(tokens.shape[1]):
        logits, *past = sess.run(list(layout.output_names), step_feeds(layout, ids, mask, past))
        picked.append(logits[:, -1].argmax(-1))
        ids = tokens[:, t:t + 1].astype(np.int64)
        mask = np.ones((rows, mask.shape[1] + 1), np.int64)
    return np.stack(picked, axis=1)


def greedy_tokens(sess, layout: CacheLayout, prompts: np.ndarray, new_tokens: int,
                  target: Target = CPU_TARGET) -> np.ndarray:
    """The variant's own greedy tokens [rows, new_tokens] (plain argmax, no end-of-sequence stop)."""
    return greedy(sess, layout, prompts, np.ones(prompts.shape, np.int64), new_tokens, PLAIN, target)


def timed_greedy(sess, layout: CacheLayout, input_ids: np.ndarray, new_tokens: int,
                 target: Target = CPU_TARGET) -> list[float]:
    """The seconds of each step of the greedy loop with the cache on ``target``'s device
    (:func:`~onnxport.decoder.generation.stream_bound`, unpadded rows; step 0 is the prompt)."""
    seconds, t0 = [], time.perf_counter()
    for _ in stream_bound(sess, layout, input_ids, np.ones(input_ids.shape, np.int64), new_tokens, PLAIN, target):
        now = time.perf_counter()
        seconds.append(now - t0)
        t0 = now
    return seconds


def speed(run: Callable[[int], list[float]], batch: int, tokens: int, repeats: int) -> tuple[float, float]:
    """(prompt seconds, decode tokens/s) from ``run(n)``, which returns the seconds of each of n greedy steps:
    the fastest prompt step and the median decode step over ``repeats`` runs after a warm-up (the median, so a
    machine shared with other work does not decide); tokens/s counts every row."""
    run(2)  # warm-up: allocations, kernels chosen
    runs = [run(1 + tokens) for _ in range(repeats)]
    step = float(np.median([t for r in runs for t in r[1:]])) if tokens else float("nan")
    return min(r[0] for r in runs), batch / max(step, 1e-9)


def decode_speed(sess, layout: CacheLayout, *, batch: int = 1, prompt: int = SPEED_PROMPT,
                 tokens: int = SPEED_TOKENS, repeats: int = REPEATS, seed: int = 0,
                 target: Target = CPU_TARGET) -> tuple[float, float]:
    """(prompt seconds, decode tokens/s) of the greedy loop on ``batch`` rows of a random ``prompt``-token
    prompt, then ``tokens`` new ones, the cache on ``target``'s device (see :func:`speed`)."""
    ids = np.random.default_rng(seed).integers(0, max(layout.vocab, 1), (batch, prompt), dtype=np.int64)
    return speed(lambda n: timed_greedy(sess, layout, ids, n, target), batch, tokens, repeats)


# --------------------------------------------------------------------------- building


def op_counts(path: Path | onnx.ModelProto) -> Counter:
    """Node count per op type (``domain:op`` outside the ONNX domain), If/Loop bodies left out."""
    model = path if isinstance(path, onnx.ModelProto) else onnx.load(str(path), load_external_data=False)
    return Counter(f"{n.domain}:{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                   for n in model.graph.node)


def fused_ops(counts: Counter) -> tuple[tuple[str, int], ...]:
    """The fused or quantized op types of ``counts`` (onnxruntime's contrib ops and the ONNX fused ones)."""
    return tuple(sorted((op, n) for op, n in counts.items() if ":" in op or op in FUSED_ONNX_OPS))


def _gained(before: Counter, after: Counter) -> dict[str, int]:
    return {op: n - before.get(op, 0) for op, n in fused_ops(after) if n > before.get(op, 0)}


def _external(src: Path) -> bool:
    return file_bytes(src) > inline_limit()


def _fuse_onnxscript(src: Path, dst: Path, layout: CacheLayout) -> str:
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model, _ = optimize_for_ort(ir.load(str(src)))
    ir.save(model, str(dst), external_data=dst.name + ".data" if _external(src) else None)
    return "onnxscript ort_fusions"


def _fuse_transformers(src: Path, dst: Path, layout: CacheLayout) -> str:
    from onnxruntime.transformers import optimizer

    kind = ORT_MODEL_TYPES.get(layout.model_type, "gpt2")
    with captured_output([]), _quiet("onnxruntime.transformers"):
        opt = optimizer.optimize_model(str(src), model_type=kind, num_heads=layout.heads,
                                       hidden_size=layout.heads * layout.head_dim, opt_level=0, use_gpu=False)
        opt.save_model_to_file(str(dst), use_external_data_format=_external(src))
    return f"onnxruntime.transformers.optimizer (model_type {kind})"


def fuse_offline(src: Path, dst: Path, layout: CacheLayout | None) -> str:
    """Write ``src`` optimized by onnxruntime's offline graph optimizations (extended level, CPU: no layout
    changes) to ``dst`` (external data beside it for a large file); the tool's name. ``layout`` is not read
    (the signature of a fusion stage)."""
    write_optimized(src, dst, opt_level="extended")  # no layout changes
    return "onnxruntime offline graph optimization (extended, CPU)"


FUSION_STAGES: tuple[Callable[[Path, Path, CacheLayout], str], ...] = (
    _fuse_onnxscript, _fuse_transformers, fuse_offline)
STAGE_NAMES = ("onnxscript ort_fusions", "onnxruntime.transformers.optimizer", "onnxruntime offline optimization")


def build_fused(src: Path, dst: Path, layout: CacheLayout, tmp: Path) -> tuple[str, ...]:
    """Each fusion stage on the previous one's result; a stage that fails or fuses nothing is noted and left
    out. Nothing fused at all is :class:`~onnxport.optimize.context.Skip`."""
    notes: list[str] = []
    current, counts = src, op_counts(src)
    for i, stage in enumerate(FUSION_STAGES):
        out = tmp / f"fused-{i}.onnx"
        try:
            tool = stage(current, out, layout)
            after = op_counts(out)
        except Exception as e:  # noqa: BLE001 - one stage failing leaves the others
            notes.append(f"{STAGE_NAMES[i]}: {short_error(e)}")
            continue
        gained = _gained(counts, after)
        if not gained:
            notes.append(f"{tool}: no fusion matched")
            continue
        notes.append(f"{tool}: " + ", ".join(f"{op} +{n}" for op, n in sorted(gained.items())))
        current, counts = out, after
    if current == src:
        raise Skip("no fusion matched this graph", notes)
    move_model(current, dst)
    return tuple(notes)


def fold_transposed_weights(model: onnx.ModelProto) -> int:
    """Replace each Transpose of a 2-D weight (a tied lm_head reads the embedding so) by the transposed weight,
    so weight-only quantization sees a constant. Returns how many were folded."""
    from onnx import helper, numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    nodes, done = [], 0
    for node in model.graph.node:
        perm = next((list(helper.get_attribute_value(a)) for a in node.attribute if a.name == "perm"), [1, 0])
        if (node.op_type != "Transpose" or node.domain not in ("", "ai.onnx") or node.input[0] not in inits
                or len(inits[node.input[0]].dims) != 2 or perm != [1, 0]):
            nodes.append(node)
            continue
        w = numpy_helper.to_array(inits[node.input[0]]).T
        model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(w), node.output[0]))
        done += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return done


def _drop_unused(model: onnx.ModelProto) -> None:
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    keep = [i for i in model.graph.initializer if i.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)


def gemm_to_matmul(model: onnx.ModelProto) -> int:
    """Rewrite each Gemm with a constant weight (alpha 1, beta 1, A not transposed) as MatMul + Add, so
    weight-only quantization (MatMul only) reaches GPT-2's Conv1D layers. Returns how many were rewritten."""
    from onnx import helper, numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    nodes, done = [], 0
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (node.op_type != "Gemm" or node.domain not in ("", "ai.onnx") or node.input[1] not in inits
                or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0 or attrs.get("transA", 0)):
            nodes.append(node)
            continue
        weight = node.input[1]
        if attrs.get("transB", 0):
            w = numpy_helper.to_array(inits[weight]).T
            weight = f"{weight}__t{done}"
            model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(w), weight))
        product = node.output[0] if len(node.input) < 3 or not node.input[2] else f"{node.output[0]}__mm"
        nodes.append(helper.make_node("MatMul", [node.input[0], weight], [product], name=f"{node.name}__matmul"))
        if product != node.output[0]:
            nodes.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]], name=f"{node.name}__add"))
        done += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return done


def build_nbits(src: Path, dst: Path, bits: int) -> tuple[str, ...]:
    """Weight-only ``bits``-bit quantization (MatMulNBits, symmetric blocks of :data:`BLOCK_SIZE`) of every
    MatMul with a constant weight, lm_head included; at 4 bits the embedding Gather too (GatherBlockQuantized:
    onnxruntime quantizes Gather at 4 bits only)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    model = onnx.load(str(src))
    folded, gemms = fold_transposed_weights(model), gemm_to_matmul(model)
    _drop_unused(model)  # weights only the rewritten nodes read
    ops = ("MatMul", "Gather") if bits == 4 else ("MatMul",)
    axes = (("MatMul", 0), ("Gather", 1))
    config = DefaultWeightOnlyQuantConfig(block_size=BLOCK_SIZE, is_symmetric=True, accuracy_level=ACCURACY_LEVEL,
                                          bits=bits, op_types_to_quantize=ops, quant_axes=axes)
    quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=BLOCK_SIZE, is_symmetric=True,
                                     accuracy_level=ACCURACY_LEVEL, op_types_to_quantize=ops, quant_axes=axes,
                                     algo_config=config)
    with _quiet(QUANT_LOGGER):
        quantizer.process()
    result = quantizer.model.model
    counts = op_counts(result)
    if not counts.get("com.microsoft:MatMulNBits"):
        raise Skip(f"no MatMul with a constant weight to quantize to {bits} bits")
    save_model(result, dst, _external(src))  # dst: a temporary name (optimize.passes.build_into moves it)
    left = counts.get("MatMul", 0)
    return (f"MatMulNBits {bits}-bit, block {BLOCK_SIZE}, symmetric, accuracy level {ACCURACY_LEVEL}: "
            f"{counts['com.microsoft:MatMulNBits']} MatMul quantized ({left} left: no constant weight)"
            + (f"; {gemms} Gemm rewritten as MatMul + Add first" if gemms else "")
            + (f"; {folded} transposed weight(s) folded first" if folded else "")
            + ("; embedding Gather quantized" if counts.get("com.microsoft:GatherBlockQuantized") else
               "; embedding kept in fp32"),)


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@dataclass(frozen=True)
class DecoderBuild:
    """What a decoder variant's builder is given: the cache layout, a scratch folder, the model's rotary tables
    (None: none, or not asked for) and where the variants run."""

    layout: CacheLayout
    tmp: Path
    rotary: Rotary | None = None
    target: Target = CPU_TARGET


def _fused(src: Path, dst: Path, ctx: DecoderBuild) -> BuildOutcome:
    return BuildOutcome(notes=build_fused(src, dst, ctx.layout, ctx.tmp))


def _nbits(bits: int, src: Path, dst: Path, ctx: DecoderBuild) -> BuildOutcome:
    return BuildOutcome(notes=build_nbits(src, dst, bits))  # looked up when called (tests replace it)


register(DECODER, "fused", _fused)
register(DECODER, "int8", functools.partial(_nbits, 8))
register(DECODER, "int4", functools.partial(_nbits, 4))


# --------------------------------------------------------------------------- the variants


def policy(name: str, tolerance: Tolerance) -> Policy:
    """The decoder kind's policy for variant ``name``: fp32 variants within ``tolerance`` on every step case,
    the others by the lowest logit cosine and teacher-forced top-1 at the gates, raw and on the step logits centred
    by PyTorch's mean over the positions (falling back to elementwise at the logits' scale where that cannot
    tell: :mod:`onnxport.prove.varying`)."""
    fp32 = name in FP32_VARIANTS
    return Policy(tolerance, elementwise=fp32, metric=not fp32, cosine_min=COSINE_MIN, top1_min=TOP1_MIN,
                  cosine_name="logit cosine", top1_name="teacher-forced top-1", top1=True, fallback=not fp32)


def judge(name: str, path: Path, layout: CacheLayout, refs: References, tolerance: Tolerance,
          threads: int | None, notes: tuple[str, ...] = (), *, prompt: int = SPEED_PROMPT,
          target: Target = CPU_TARGET, options: SessionOptions | None = None) -> DecoderVariant:
    """Re-prove the variant at ``path`` against ``refs`` and time its decode at batch 1 after a ``prompt``-token
    prompt (the decoder kind's judge), on ``target``'s providers: its runs first (step cases, teacher-forced
    and own greedy tokens), then one comparison (:func:`~onnxport.prove.judging.compare_accuracy`) and one
    verdict. ``options``: the session options the variant is run with (its CUDA graph); a file sharing its past
    and present buffer is judged on the step cases its attention runs (:func:`runnable`)."""
    sess = target.with_options(options or SessionOptions.base(target.device)).session(path, threads=threads)
    refs, left_out = runnable(refs, shares_buffer(sess))
    notes = (*notes, *left_out)
    steps = step_runs(sess, layout, refs)
    forced = teacher_forced(sess, layout, refs.prompts, refs.tokens)
    own = greedy_tokens(sess, layout, refs.prompts, int(refs.tokens.shape[1]), target)
    found = compare_accuracy(steps, RunResults.of(refs.steps.cases, refs.steps.outputs), tolerance)
    top1 = token_agreement(forced, refs.tokens).share
    found = replace(found, top1=top1)
    tokens = token_agreement(own, refs.tokens)
    judged = verdict(found, policy(name, tolerance), tokens)  # policy.tokens is off: greedy steps inform only
    prompt = max(1, min(prompt, layout.max_length - 2))
    n = max(1, min(SPEED_TOKENS, layout.max_length - prompt - 1))
    prompt_s, tok_s = decode_speed(sess, layout, prompt=prompt, tokens=n, target=target)
    return DecoderVariant(name, path, file_bytes(path), fused_ops(op_counts(path)), found.max_abs_err, found.within,
                          found.cosine, top1, tokens.steps, tokens.total, tok_s, prompt_s * 1000, judged.passed,
                          judged.reason, notes, metrics=judged.metrics, varying=varying_record(found.varying, tokens),
                          session_options=None if options is None else options.to_dict())


def runnable(refs: References, shared: bool) -> tuple[References, tuple[str, ...]]:
    """``refs`` with the step cases GroupQueryAttention does not run left out when ``shared`` (several new tokens
    on a cache for more than one row), and a note saying so; unchanged otherwise."""
    keep = [i for i, (b, p, n) in enumerate(refs.steps.cases) if not (shared and b > 1 and p > 0 and n > 1)]
    if len(keep) == len(refs.steps.cases):
        return refs, ()
    steps = Refs(*(tuple(part[i] for i in keep) for part in (refs.steps.cases, refs.steps.inputs,
                                                                refs.steps.outputs)))
    return (replace(refs, steps=steps),
            (f"{len(refs.steps.cases) - len(keep)} step case(s) of several new tokens on a cache for several rows "
             "left out: GroupQueryAttention runs them for one row only",))


register_judge(DECODER, judge)


@dataclass(frozen=True)
class _Run:
    """One decoder variant run's settings: where, against what, judged how."""

    src: Path
    vdir: Path
    ctx: DecoderBuild
    refs: References
    tolerance: Tolerance
    threads: int | None
    prompt: int
    target: Target = CPU_TARGET


def _unmade(why: Unmade) -> DecoderVariant:
    """The record of a decoder variant its pass stopped: not built (skipped or crashed), or built and not run."""
    if why.stage == "ensures" and why.path is not None:
        return DecoderVariant(why.name, why.path, file_bytes(why.path) if why.path.is_file() else None,
                              passed=False, error=f"cannot run: {why.why}", notes=why.notes)
    return DecoderVariant(why.name, None, passed=False, error=f"not built: {why.why}", notes=why.notes,
                          skip_reason=why.reason)


def variant_pass(name: str, run: _Run) -> VariantPass[DecoderVariant]:
    """Variant ``name`` as a pass: built by its registered builder (:func:`~onnxport.optimize.passes.build_into`;
    the export itself for the baseline), judged by the decoder kind's judge."""
    judged = functools.partial(registry.judge(DECODER), name, layout=run.ctx.layout, refs=run.refs,
                               tolerance=run.tolerance, threads=run.threads, prompt=run.prompt, target=run.target)
    build = (None if name == BASELINE else functools.partial(
        build_into, registry.builder(DECODER, name), run.src, run.vdir / f"{name}.onnx", run.ctx))
    return VariantPass(name, run.src, build, lambda made: judged(path=made.file, notes=made.outcome.notes,
                                                                 options=made.outcome.session_options), _unmade,
                       baseline_notes=("the proven export itself",))


def variant_names(names: Sequence[str] | str | None, target: Target = CPU_TARGET) -> tuple[str, ...]:
    """The variants to make, ``export`` (the baseline) always first (None, "all", "auto": the decoder kind's
    defaults, and on a CUDA target its GPU variants too; :func:`onnxport.optimize.registry.chosen`, a
    UsageError for a name the kind lacks)."""
    names = "all" if names is None else names
    chosen = registry.chosen(names, DECODER)
    if target.gpu and names in ("all", "auto", ["all"], ["auto"]):
        chosen = tuple(n for n in registry.kind(DECODER).names if n in chosen or n in GPU_DEFAULT)
    return (BASELINE, *chosen)


def optimize_decoder(model: nn.Module, layout: CacheLayout, proven_path: str | Path, out_dir: str | Path, *,
                     names: Sequence[str] | str | None = None, tolerance: Tolerance = FP32,
                     progress: Progress = noop, settings: CacheVariants | None = None,
                     target: Target = CPU_TARGET) -> DecoderVariants:
    """Make each variant of the proven file at ``proven_path`` in ``out_dir/variants/``, re-prove it against
    ``model`` and time it; a variant that cannot be made or run is recorded with why, never raised.
    ``settings`` (its names not read: ``names``): ``budget_s``, no variant is started after that many seconds
    (recorded as skipped); ``threads``, onnxruntime's threads for judging and timing; ``seq``, the prompt length
    decode speed is timed after. ``target``: where the variants are judged and timed (PyTorch's references are
    computed on the CPU)."""
    settings = settings or CacheVariants()
    threads, seq = settings.threads, settings.seq
    budget = Budget(time.perf_counter(), settings.budget_s)
    wanted = variant_names(names, target)
    src = Path(proven_path)
    vdir = Path(out_dir) / "variants"
    vdir.mkdir(parents=True, exist_ok=True)
    progress("variants: PyTorch references for the step cases and teacher-forced tokens")
    model.eval()
    refs = references(model, layout)
    prompt = seq or SPEED_PROMPT
    with tempfile.TemporaryDirectory(prefix=".onnxport-variants-", dir=vdir) as tmp:
        rotary = rotary_tables(model, layout.max_length) if set(wanted) & set(GPU_DEFAULT) else None
        run = _Run(src, vdir, DecoderBuild(layout, Path(tmp), rotary, target), refs, tolerance, threads, prompt,
                   target)

        def one(name: str, say: Progress) -> DecoderVariant:
            say(f"variant {name}: building, proving against PyTorch and timing decode")
            return variant_pass(name, run)()

        def skipped(name: str, why: str, reason: SkipReason) -> DecoderVariant:
            return DecoderVariant(name, None, passed=False, error=why, skip_reason=reason)

        # the export, like the plain path's baseline, is judged whatever the budget: the others are timed against it
        made = [one(BASELINE, progress), *each_variant(wanted[1:], one, skipped, progress, budget)]
    with contextlib.suppress(OSError):
        if not any(vdir.iterdir()):
            os.rmdir(vdir)
    return DecoderVariants(tuple(made), COSINE_MIN, TOP1_MIN, threads, prompt=prompt, device=target.device)


from onnxport.decoder.device_variants import GPU_DEFAULT  # noqa: E402 - registers the gqa, fp16 and cuda-graph builders
