"""Build every variant asked for, prove each against PyTorch, time them against the plain export, pick the best.

Variants that do not apply are kept in the list, skipped with the reason. Failures carry the localized
divergence and are never chosen. Latency is measured with ONNX Runtime, interleaved with the plain export.
"""

from __future__ import annotations

import functools
import math
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from onnxport.bench import bench_sizes, sizes_at, stats, timed_blocks
from onnxport.bench.resident import PER_CALL, RESIDENT, call_or_run
from onnxport.core.errors import OnnxportError, UsageError
from onnxport.core.logs import Progress, noop
from onnxport.core.onnxfile import file_bytes
from onnxport.core.records import FP16, FP32, BatchInvariance, Tolerance
from onnxport.core.samples import Case, make_inputs, validation_cases
from onnxport.optimize import policy  # noqa: F401 - registers the MODEL kind's judge
from onnxport.optimize.context import (
    BuildContext,
    Builder,
    BuildOutcome,
    Refs,
    reference_outputs,
)
from onnxport.optimize.fusion import build_fused, transformer_params
from onnxport.optimize.gpu import (
    GRAPH_BASES,
    build_cuda_graph,
    build_fp16_nhwc,
    build_fp16_sdpa,
    build_tensorrt,
    build_tf32,
)
from onnxport.optimize.graph import build_ort, build_slim, file_facts, relative, short_error
from onnxport.optimize.openvino import build_openvino, build_openvino_bf16, build_openvino_int8
from onnxport.optimize.passes import (
    Budget,
    Built,
    Unmade,
    VariantPass,
    build_into,
    choose_best,
    clearly_faster,
    each_variant,
    fastest,
    install_best,
)
from onnxport.optimize.plan import DEFAULT_BUDGET_S, Plan, default_plan
from onnxport.optimize.precision import build_fp16
from onnxport.optimize.registry import MODEL, builder, judge, register
from onnxport.optimize.result import (
    ALL_VARIANTS,
    AUTO,
    BASELINE,
    OptimizeResult,
    Variant,
    parse_names,
)
from onnxport.optimize.sensitivity import build_int8_searched
from onnxport.prove import batching
from onnxport.prove.samples import SampleRefs
from onnxport.runtime import environment
from onnxport.runtime.backends import OrtBackend, default_threads
from onnxport.runtime.feeds import FeedMap
from onnxport.runtime.sessions import CPU, TENSORRT
from onnxport.runtime.variant_sessions import (
    SessionBackend,
    SessionOptions,
    is_openvino,
    needs_fixed_shapes,
    open_for,
    providers_for,
)
from onnxport.sources.base import LoadedModel

TIMING_MEMORY_BYTES = 4 * 1024**3  # above this much ONNX on disk, variants are timed one at a time

Latencies = dict[str, dict[str, float]]  # p50 ms per variant name and batch


# --------------------------------------------------------------------------- choosing


def geomean_speedup(latency: Mapping[str, float], base: Mapping[str, float]) -> float | None:
    """The geometric mean over the batches ``base`` was timed at of ``base[b] / latency[b]`` (p50 ms keyed by
    batch); None when ``latency`` lacks one of them (a variant that did not run at a batch cannot be chosen)."""
    keys = [str(k) for k in base if base[k]]
    got = {str(k): v for k, v in latency.items()}
    if not keys or any(not got.get(k) for k in keys):
        return None
    return float(math.exp(sum(math.log(float(base[k]) / float(got[k])) for k in keys) / len(keys)))


def select_best(entries: Sequence[Variant | Mapping[str, Any]]) -> Variant | Mapping[str, Any] | None:
    """The passing entry with the highest geometric-mean speedup over the export across the batches timed (each
    batch's p50 relative to the export's at that batch: a variant 3 % faster at batch 1 and 25 % slower at
    batch 8 does not win); ties: the smaller file. The speedup recorded in ``details["geomean_speedup"]`` is used
    where present, else it is computed from ``latency_ms`` against the export entry (against the fastest entry at
    each batch when there is none, which ranks the same). None when no entry passed and was timed.

    The ranking is :func:`~onnxport.optimize.passes.fastest`, the one :func:`~onnxport.optimize.passes.choose_best`
    ranks by; the 5 % rule (keeping the export unless the top one is clearly faster) is ``choose_best``'s alone."""

    def get(e, key):
        return e.get(key) if isinstance(e, Mapping) else getattr(e, key)

    def lat(e) -> dict[str, float]:
        return {str(k): float(v) for k, v in (get(e, "latency_ms") or {}).items() if v}

    timed = [e for e in entries if get(e, "passed") and not get(e, "skipped") and lat(e)]
    export = next((e for e in entries if get(e, "name") == BASELINE and lat(e)), None)
    if export is not None:
        base = lat(export)
    else:
        batches = set.intersection(*(set(lat(e)) for e in timed)) if timed else set()
        base = {b: min(lat(e)[b] for e in timed) for b in batches}

    def score(e) -> float | None:
        recorded = (get(e, "details") or {}).get("geomean_speedup")
        return float(recorded) if recorded is not None else geomean_speedup(lat(e), base)

    return fastest(timed, score, lambda e: get(e, "bytes"), lambda e: get(e, "passed"))


# --------------------------------------------------------------------------- timing


def _backend(name: str, path: Path, options: SessionOptions | None, threads: int, out_dir: Path | None,
             device: str):
    """The timing backend of one file run with its variant's session ``options`` (IO binding on a GPU; OpenVINO
    through its session adapter)."""
    if options is not None and (needs_fixed_shapes(options) or options.provider == TENSORRT or is_openvino(options)):
        return SessionBackend(path, open_for(options, out_dir, threads=threads), name)
    providers = providers_for(options, out_dir) if options is not None and options.provider != CPU else None
    return OrtBackend(path, threads=threads, name=name, providers=providers, io_binding=device == "cuda")


def measure(paths: dict[str, Path], loaded: LoadedModel, batches: Sequence[int], *, seq: int | None = None,
            seconds: float = 1.5, threads: int | None = None, options: Mapping[str, SessionOptions] | None = None,
            out_dir: Path | None = None, device: str = "cpu") -> Latencies:
    """p50 ms per name and batch, all files timed in interleaved warm blocks on the same inputs and threads;
    ``options``: each name's session options (optimize/gpu.py), ``out_dir`` resolves their relative paths. On
    "cuda" each file is timed device-resident (bench/resident.py: inputs and outputs bound once on the GPU, a
    CUDA graph replayed), the way it runs deployed."""
    threads = threads or default_threads()
    backends = {}
    for name, p in paths.items():
        b = _backend(name, p, (options or {}).get(name), threads, out_dir, device)
        try:
            b.open()
        except Exception:  # noqa: BLE001 - a file that cannot load was already reported by prove()
            continue
        backends[name] = b
    out: Latencies = {n: {} for n in paths}
    sizes, _ = bench_sizes(loaded, batches, [seq] if seq else None)
    for batch, _s, dims in sizes:
        tensors = make_inputs(loaded.inputs, dims, "random", 7)
        feeds_by = {name: FeedMap.of(loaded.inputs, [i.name for i in b.inputs])(tensors)
                    for name, b in backends.items()}
        names = []
        for n, b in backends.items():
            try:
                b.run(feeds_by[n])
            except Exception:  # noqa: BLE001 - a file that fails at this shape is not timed here
                continue
            names.append(n)
        calls = {n: call_or_run(backends[n], feeds_by[n], resident=device == "cuda")[0] for n in names}
        times = timed_blocks(calls, seconds=seconds)
        for n in names:
            out[n][str(batch)] = round(stats(times[n], batch)["p50_ms"], 4)
    for b in backends.values():
        b.close()
    return out


@dataclass(frozen=True)
class _Timing:
    """How the variants are timed: the model's inputs at these batches and sequence length, on ``threads``."""

    loaded: LoadedModel
    batches: Sequence[int]
    seq: int | None
    seconds: float
    threads: int
    options: dict[str, SessionOptions] = field(default_factory=dict)  # each variant's session options (as built)
    out: Path | None = None
    device: str = "cpu"

    @property
    def first_key(self) -> str:
        """The latency key of the first batch timed (batch 1 is preferred where it was timed)."""
        return str(list(self.batches)[0]) if self.batches else "1"

    def run(self, paths: dict[str, Path], batches: Sequence[int] | None = None,
            seconds: float | None = None) -> Latencies:
        """:func:`measure` (looked up at call time) of ``paths`` at these settings."""
        return measure(paths, self.loaded, self.batches if batches is None else batches, seq=self.seq,
                       seconds=self.seconds if seconds is None else seconds, threads=self.threads,
                       options=self.options, out_dir=self.out, device=self.device)

    def fastest(self, paths: dict[str, Path]) -> str:
        """The name of the fastest of ``paths`` at the first size timed (a short timing)."""
        lat = self.run(paths, seconds=min(self.seconds, 1.0))
        return min(paths, key=lambda n: lat.get(n, {}).get(self.first_key) or float("inf"))


def _latencies(timed: dict[str, Path], timing: _Timing) -> tuple[Latencies, Latencies]:
    """(latencies, the export's latencies each variant's speedups are relative to)."""
    if sum(file_bytes(p) for p in timed.values() if p.exists()) <= TIMING_MEMORY_BYTES:
        lat = timing.run(timed)
        return lat, dict.fromkeys(timed, lat.get(BASELINE, {}))
    # large files: one variant at a time beside the export, so at most two sessions are in memory
    lat: Latencies = {}
    base: Latencies = {}
    for name, p in timed.items():
        if name == BASELINE:
            continue
        pair = timing.run({BASELINE: timed[BASELINE], name: p})
        lat[name] = pair.get(name, {})
        lat.setdefault(BASELINE, pair.get(BASELINE, {}))
        base[name] = pair.get(BASELINE, {})
    base[BASELINE] = lat.get(BASELINE, {})
    return lat, base


def _timed(entries: Sequence[Variant], lat: Latencies, base: Latencies, key: str) -> list[Variant]:
    """``entries`` with their latencies, their speedup over the export at the first batch (``speedup``) and, in
    ``details``, at each batch and their geometric mean (what :func:`select_best` chooses by)."""
    final = []
    for e in entries:
        lm = lat.get(e.name, {})
        ref = base.get(e.name) or {}
        mine, base1 = lm.get("1", lm.get(key)), ref.get("1", ref.get(key))
        speed = round(base1 / mine, 3) if base1 and mine else None
        details = e.details
        if lm and ref:
            by = {b: round(ref[b] / lm[b], 3) for b in lm if ref.get(b) and lm[b]}
            mean = geomean_speedup(lm, ref)
            details = {**e.details, "speedup_by_batch": by,
                       "geomean_speedup": None if mean is None else round(mean, 3)}
        final.append(replace(e, latency_ms=lm, speedup=speed, details=details))
    return final


def _speedup(v: Variant) -> float | None:
    """What the plain kind's best is chosen by: the geometric-mean speedup over the export across the batches
    timed (recorded by :func:`_timed`); None for a variant not timed."""
    found = v.details.get("geomean_speedup") if v.latency_ms else None
    return None if found is None else float(found)


def _confirm(final: list[Variant], timed: dict[str, Path], timing: _Timing,
             say: Progress) -> tuple[list[Variant], Variant | None]:
    """Every kind's best-selection (:func:`~onnxport.optimize.passes.choose_best`: the passing variant with the
    best geometric-mean speedup when clearly faster, else the export), a winner other than the export confirmed
    against the export alone at every batch timed (the export again when the confirmation does not back it), and
    ``final`` with the confirmed speedup and how it was chosen in its details."""
    best = choose_best(final, _speedup, lambda v: v.bytes)
    if best is not None and best.name != BASELINE:
        # the round-robin over every variant gives each few runs: confirm the winner against the export alone,
        # longer, before it replaces the export (a noisy machine otherwise picks a slower file)
        say(f"confirming {best.name} against the plain export")
        again = timing.run({BASELINE: timed[BASELINE], best.name: timed[best.name]},
                           seconds=max(1.5 * timing.seconds, 2.0))
        mean = geomean_speedup(again.get(best.name, {}), again.get(BASELINE, {}))
        confirmed = None if mean is None else round(mean, 3)
        batches = ", ".join(again.get(BASELINE, {}))
        best = replace(best, details={
            **best.details, "confirmed_speedup": confirmed,
            "chosen_by": f"geometric-mean speedup over the export at batch {batches}: "
                         f"{best.details.get('geomean_speedup')}x (confirmed alone: {confirmed}x)"})
        final = [best if v.name == best.name else v for v in final]
        if not clearly_faster(confirmed):
            best = final[0] if final[0].passed else None
    return final, best


# --------------------------------------------------------------------------- building


def _build_fused_int8(src: Path, dst: Path, ctx: BuildContext) -> BuildOutcome:
    """int8 of the ``fused`` variant (built here, in a temporary folder, when it was not asked for)."""
    fused = ctx.built.get("fused")
    if fused is not None:
        return build_int8_searched("fused+int8", fused, dst, ctx)
    with tempfile.TemporaryDirectory(prefix="onnxport-fused-") as tmp:
        tmp_fused = Path(tmp) / "fused.onnx"
        build_fused(src, tmp_fused, ctx)  # raises Skip for non-transformers
        return build_int8_searched("fused+int8", tmp_fused, dst, ctx)


def _build_cuda_graph(src: Path, dst: Path, ctx: BuildContext) -> BuildOutcome:
    """A CUDA graph of the fastest file proven so far (the export among them)."""
    return build_cuda_graph(src, dst, ctx, {"export": src, **ctx.passed}, fastest=ctx.fastest)


BUILDERS: dict[str, Builder] = {
    "slim": build_slim, "ort": build_ort, "fused": build_fused, "fp16": build_fp16,
    "int8": functools.partial(build_int8_searched, "int8"), "fused+int8": _build_fused_int8, "tf32": build_tf32,
    "fp16-nhwc": build_fp16_nhwc, "fp16-sdpa": build_fp16_sdpa, "tensorrt": build_tensorrt,
    "cuda-graph": _build_cuda_graph, "openvino": build_openvino,
    "openvino-bf16": build_openvino_bf16, "openvino-int8": build_openvino_int8,
}
for _name, _builder in BUILDERS.items():
    register(MODEL, _name, _builder)


def build_variant(name: str, src: Path, dst: Path, ctx: BuildContext) -> BuildOutcome:
    """Write variant ``name`` of ``src`` to ``dst`` with its registered builder (``ctx.built``: the variants
    already written, fused+int8 starts from ``fused``; ``ctx.passed`` and ``ctx.fastest``: the files already
    proven and how to pick the fastest, cuda-graph captures one). Raises Skip when the variant does not apply."""
    return builder(MODEL, name)(src, dst, ctx)


def _opener(ctx: BuildContext, options: SessionOptions | None, out: Path):
    """How a variant's proof opens its session: with its own options, or on a GPU the recorded defaults (CUDA,
    TF32 off) rather than whatever chain the device has; None on the CPU (the configured sessions)."""
    if options is None and ctx.device != "cuda":
        return None
    return open_for(options or SessionOptions.base(ctx.device), out)


def _baseline(model_path: Path, out: Path, ctx: BuildContext) -> Variant:
    """The plain export, proven like every variant (no divergence: it was proven when exported)."""
    ctx.progress("proving the plain export (baseline)")

    def proven(made: Built) -> Variant:
        t0 = time.perf_counter()
        proof = judge(MODEL)(ctx.loaded, BASELINE, model_path, ctx.refs, ctx.tolerance, ctx.samples,
                             _opener(ctx, None, out))
        return Variant(BASELINE, relative(model_path, out), prove_seconds=time.perf_counter() - t0,
                       batch_invariant=_batch_invariance(ctx, BASELINE, model_path),
                       session_options=SessionOptions.base(ctx.device),
                       **file_facts(model_path), **replace(proof, divergence=None, divergence_error=None).variant_fields())

    return VariantPass(BASELINE, model_path, None, proven, _unmade, raised=(OnnxportError,))()


def _unmade(why: Unmade) -> Variant:
    """The record of a plain variant its pass stopped: skipped (with its reason), its builder crashed, or its
    file could not be judged."""
    if why.stage == "call" and why.reason is not None:
        return Variant.skip(why.name, why.why, why.reason, why.seconds)
    doing = "proving failed" if why.stage == "ensures" else "building failed"
    return Variant(why.name, None, False, reason=f"{doing}: {why.why}", build_seconds=why.seconds)


def _variant(name: str, src: Path, dst: Path, out: Path, ctx: BuildContext) -> Variant:
    """Variant ``name`` as a pass (:class:`~onnxport.optimize.passes.VariantPass`): built into ``dst`` by its
    registered builder, then proven by the plain kind's judge under its policy (a builder that crashes gives a
    failed variant)."""
    ctx.progress(f"variant {name}: building")
    build = functools.partial(build_into, builder(MODEL, name), src, dst, ctx)
    return VariantPass(name, src, build, functools.partial(_proven, name, dst, out, ctx), _unmade,
                       raised=(OnnxportError,))()


def _proven(name: str, dst: Path, out: Path, ctx: BuildContext, made: Built) -> Variant:
    """The plain kind's judge on a built variant: its proof (the builder's own, or :func:`policy.prove` under
    its policy, on the session its options open), its batch invariance, its file's facts."""
    outcome, file = made.outcome, made.file
    ctx.progress(f"variant {name}: proving against PyTorch")
    t1 = time.perf_counter()
    opener = _opener(ctx, outcome.session_options, out)
    proof = (outcome.proof if outcome.proof is not None
             else judge(MODEL)(ctx.loaded, outcome.policy or name, file, ctx.refs, ctx.tolerance, ctx.samples,
                               opener))
    prove_s = outcome.prove_seconds + time.perf_counter() - t1
    # a file run with other provider options: its batch invariance is the file's, checked where it was built
    invariant = (_batch_invariance(ctx, name, dst, opener if is_openvino(outcome.session_options) else None)
                 if proof.passed and outcome.path is None else None)
    return Variant(name, relative(file, out), build_seconds=made.seconds, prove_seconds=prove_s,
                   details=outcome.details, batch_invariant=invariant,
                   session_options=outcome.session_options or SessionOptions.base(ctx.device),
                   **file_facts(file), **proof.variant_fields())


def _batch_invariance(ctx: BuildContext, name: str, path: Path, opener=None) -> BatchInvariance | None:
    """The batching case of a variant's proof (fp16 within its own tolerance, every other one within fp32's;
    ``opener``: the session it runs on where ONNX Runtime does not run it, OpenVINO's for ``openvino-int8``)."""
    ctx.progress(f"variant {name}: each row alone against the same row inside a batch")
    try:
        result = batching.check(ctx.loaded, path, tolerance=FP16 if "fp16" in name else FP32,
                                sess=None if opener is None else opener(path))
    except Exception as e:  # noqa: BLE001 - a file that cannot run at the batch size is not batch-safe
        return BatchInvariance(0, False, float("nan"), None, True, f"the batched run failed: {short_error(e)}")
    return result if result.applicable else None


# --------------------------------------------------------------------------- entry point


@dataclass(frozen=True)
class VariantOptions:
    """What :func:`variants` builds and how it judges and times them (see there)."""

    names: Sequence[str] | str | None = None
    tolerance: Tolerance = FP32
    cases: list[Case] | None = None
    bench_batches: Sequence[int] = (1, 8)
    bench_seq: int | None = None
    bench_seconds: float = 1.5
    budget_s: float | None = None
    device: str = "cpu"
    threads: int | None = None


def variants(loaded: LoadedModel, model_path: str | Path, out_dir: str | Path,
             options: VariantOptions = VariantOptions(), *, progress: Progress | None = None,
             samples: SampleRefs | None = None, known: Refs | None = None) -> OptimizeResult:
    """Build the ``options.names`` variants of ``model_path`` under OUT/variants/, prove each against PyTorch,
    time them interleaved with the plain export, and copy the fastest passing one (or the export) to
    OUT/best.onnx.

    ``names``: a list, "all" (None) or "auto": the variants that can win for this model on ``device``
    (:func:`~onnxport.optimize.plan.default_plan`; the others are listed as skipped, with the reason).
    ``budget_s``: no variant is started after that many seconds (the int8 search stops at the budget too).
    The winner has the best geometric-mean speedup over the export across ``bench_batches`` (each batch's p50
    relative to the export's there) at, for token inputs, sequence length ``bench_seq`` (default: the export
    size): int8 and fusions pay off differently at 16 and at 128 tokens, so time at your traffic's length.
    ``samples``: the user's samples with PyTorch's outputs (``prove.samples.references``): static int8 calibrates
    on them, and every variant is judged on them too (one that fails there is rejected).
    ``device`` "cuda": the variants are proven and timed on the GPU providers (IO binding), the GPU variants
    (tf32, fp16-nhwc, fp16-sdpa, tensorrt, cuda-graph; optimize/gpu.py) can be built, and each variant records the session options
    it needs (``Variant.session_options``; the best's go to report.json ``best.session_options``).
    ``threads``: onnxruntime's threads for the timing (default: the machine's). ``known``: PyTorch's outputs
    already computed on some cases (the export's proof), not computed again.
    """
    o = options
    names, tolerance, cases, bench_batches, bench_seq = o.names, o.tolerance, o.cases, o.bench_batches, o.bench_seq
    bench_seconds, budget_s, device, threads = o.bench_seconds, o.budget_s, o.device, o.threads
    say = progress or noop
    wanted = parse_names(names)
    if wanted == AUTO and budget_s is None:
        budget_s = DEFAULT_BUDGET_S
    budget = Budget(time.perf_counter(), budget_s)
    if device == "cuda" and names in (None, "all", ["all"]):
        wanted = list(ALL_VARIANTS)
    plan = (default_plan(loaded, device, environment.cpu()["flags"], calibrated=samples is not None) if wanted == AUTO
            else Plan(tuple(wanted)))
    model_path, out = Path(model_path), Path(out_dir)
    if not model_path.is_file():
        raise UsageError(f"ONNX file not found: {model_path}", "pass the model.onnx that onnxport export wrote")
    threads = threads or default_threads()
    if not plan.build:  # nothing can win here: no proof or timing to spend, the export is the model to deploy
        say("no variant to build for this model on this device (--variants all builds every one)")
        skipped = tuple(Variant.skip(n, plan.skipped[n], plan.reason(n)) for n in ALL_VARIANTS if n in plan.skipped)
        return OptimizeResult(skipped, None, None, threads, timed_at=sizes_at(loaded, bench_seq))
    vdir = out / "variants"
    vdir.mkdir(parents=True, exist_ok=True)
    every = cases if cases is not None else validation_cases(loaded.dims)
    judged_on, left_out = (every, []) if wanted != AUTO or cases is not None else screening_cases(loaded, every)
    refs = reference_outputs(loaded, judged_on, known)
    timed_at = sizes_at(loaded, bench_seq)
    options: dict[str, SessionOptions] = {}
    timing = _Timing(loaded, bench_batches, bench_seq, bench_seconds, threads, options, out, device)
    ctx = BuildContext(loaded, tolerance, refs, transformer_params(loaded), say, deadline=budget.deadline,
                       samples=samples, device=device, out=out, timed_at=timed_at, fastest=timing.fastest,
                       thorough=wanted != AUTO)
    entries = [_baseline(model_path, out, ctx)]
    files = {BASELINE: model_path}
    entries += _build_all(plan, model_path, vdir, out, ctx, budget, files, timing)
    options.update({e.name: e.session_options for e in entries if e.session_options is not None})

    say("timing the variants against the plain export")
    timed = {e.name: files[e.name] for e in entries if e.name in files}
    final, best = _confirm(_timed(entries, *_latencies(timed, timing), timing.first_key), timed, timing, say)
    left_refs: Refs | None = None  # PyTorch on the cases left to the best, once however many bests fail there
    while left_out and best is not None and best.name != BASELINE:
        left_refs = left_refs or reference_outputs(loaded, left_out, known)
        failed = _left_out_failure(best, timed[best.name], left_refs, ctx)
        if failed is None:
            break
        final = [failed if v.name == best.name else v for v in final]
        final, best = _confirm(final, timed, timing, say)
    best_path = install_best(timed[best.name], out) if best is not None else None
    judged = {"cases": [c.label for c in judged_on], "left_out": [c.label for c in left_out]}
    if left_out:
        judged["why"] = (f"the default plan judges every variant without the case '{left_out[0].label}' (each dim's "
                         "maximum has a case of its own; the export is proven on it); the best is proven on it "
                         "before it is chosen (--variants all judges every variant on every case)")
    return OptimizeResult(tuple(final), best, best_path, threads, timed_at=timed_at, judged_on=judged,
                          timing=RESIDENT if device == "cuda" else PER_CALL)


def screening_cases(loaded: LoadedModel, cases: Sequence[Case]) -> tuple[list[Case], list[Case]]:
    """(the cases the default plan judges every variant on, the cases only the best is proven on): the all-max
    case is left to the best where every dynamic dim's maximum has a case of its own (it is the costliest case by
    far: 64×512 tokens costs more than all the others together)."""
    own_max = len(loaded.dims) > 1 and sum(c.label.startswith("max ") for c in cases) >= len(loaded.dims)
    if not own_max:
        return list(cases), []
    return [c for c in cases if c.label != "max"], [c for c in cases if c.label == "max"]


def _left_out_failure(best: Variant, path: Path, refs: Refs, ctx: BuildContext) -> Variant | None:
    """``best`` failed, with the reason, when it fails the cases of ``refs`` (those left to the best) under its
    policy; None when it passes."""
    left = ", ".join(c.label for c in refs.cases)
    ctx.progress(f"proving {best.name} on the case(s) left to the best: {left}")
    proof = judge(MODEL)(ctx.loaded, best.name, path, refs, ctx.tolerance, None,
                         _opener(ctx, None if best.session_options == SessionOptions.base(ctx.device)
                                 else best.session_options, ctx.out or path.parent))
    if proof.passed:
        return None
    return replace(best, passed=False, reason=f"on the case(s) {left}: {proof.reason}")


def _build_all(plan: Plan, model_path: Path, vdir: Path, out: Path, ctx: BuildContext, budget: Budget,
               files: dict[str, Path], timing: _Timing) -> list[Variant]:
    """Every variant in :data:`ALL_VARIANTS` order: built and proven when the plan says so and the budget allows,
    else listed as skipped with the reason (:func:`~onnxport.optimize.passes.each_variant`).
    ``files`` gets the file each built variant runs (a GPU variant may run one built before)."""
    entries: list[Variant] = []
    built: dict[str, Path] = {}
    passed: dict[str, Path] = {}

    def run(name: str, say: Progress) -> Variant:
        timing.options.update({e.name: e.session_options for e in entries if e.session_options is not None})
        step = replace(ctx, progress=say, built=dict(built), passed=dict(passed),
                       options={e.name: e.session_options for e in entries if e.session_options is not None})
        entry = _variant(name, model_path, vdir / f"{name}.onnx", out, step)
        entries.append(entry)
        if entry.path:
            inside = out / entry.path  # relative() names a file in OUT relative to it, any other as given
            files[name] = inside if inside.exists() else Path(entry.path)
            if entry.session_options in (None, SessionOptions.base(ctx.device)):
                built[name] = files[name]
            if entry.passed and (entry.session_options in (None, SessionOptions.base(ctx.device))
                                 or name in GRAPH_BASES):  # a CUDA graph may capture it, with its options
                passed[name] = files[name]
        return entry

    names = [n for n in ALL_VARIANTS if n in plan.build or n in plan.skipped]
    planned_out = {n: (plan.skipped[n], plan.reason(n)) for n in names if n in plan.skipped}
    return each_variant(names, run, lambda n, why, reason: Variant.skip(n, why, reason), ctx.progress, budget,
                        planned_out)
