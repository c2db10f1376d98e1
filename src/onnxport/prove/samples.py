"""The proof on the user's own samples (``--samples``): every sample through PyTorch and ONNX Runtime in batches of
a declared size, each sample judged alone (the fp32 tolerance, or its output's ``--compare`` rule), and what the
task cares about: top-1/top-5 agreement for classifiers, the cosine of the (mean-pooled) embedding for encoders.

The generated cases prove the shapes; the samples prove the values the model will see. A sample outside the
tolerance fails the proof like a failing case does, named by its index (and line or image).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from onnxport.core.diagnostics import Diagnostic, error
from onnxport.core.records import FP32, Tolerance, finite
from onnxport.core.samples import Case
from onnxport.prove.compare import cosine_agreement, judge, mean_pool, row_cosines, task_kind, topk_agreement
from onnxport.prove.parity import short_ort_error
from onnxport.prove.references import Refs, fingerprint, run_each
from onnxport.prove.varying import centred
from onnxport.runtime.feeds import FeedMap
from onnxport.runtime.sessions import session
from onnxport.sources.base import LoadedModel
from onnxport.sources.datasets import SampleSet, row_dims

BATCH = 8  # samples per run, within the declared batch range
SHOWN_FAILURES = 20  # failing samples listed in the report (all are counted)


@dataclass(frozen=True)
class SampleBatch:
    """One run: the samples at ``indices`` stacked (padded per batch; rows past them repeat the first sample, so
    that the batch has a size the model declares) and PyTorch's outputs on them (None: PyTorch failed)."""

    indices: tuple[int, ...]
    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[np.ndarray, ...] | None = None
    error: str | None = None


@dataclass(frozen=True)
class SampleRefs:
    """The samples in batches with PyTorch's outputs: computed once, shared by the export's proof and every variant."""

    samples: SampleSet
    batches: tuple[SampleBatch, ...]
    batch_size: int

    def as_refs(self) -> Refs:
        """The batches PyTorch ran as :class:`~onnxport.prove.references.Refs` (the task metric and the int8
        search read them like the generated cases)."""
        ran = [b for b in self.batches if b.outputs is not None]
        return Refs(tuple(Case(f"samples {b.indices[0]}..{b.indices[-1]}", {}, "samples") for b in ran),
                    tuple(b.inputs for b in ran), tuple(list(b.outputs) for b in ran))


@dataclass(frozen=True)
class SampleProof:
    """How one ONNX file did on the samples."""

    samples: SampleSet
    batch_size: int
    tolerance: Tolerance
    errors: tuple[float, ...]  # per sample: the largest abs error over its outputs (inf: it did not run)
    failures: tuple[tuple[int, str], ...]  # (sample index, why) of every failing sample
    metrics: dict = field(default_factory=dict)  # task metrics, see agreement()
    seconds: float = 0.0
    cannot_tell: dict = field(default_factory=dict)  # outputs the same for every sample, and why (prove/telling.py)
    outputs: int = 0  # how many outputs were judged

    @property
    def told(self) -> bool:
        """Whether some output's references differ between the samples (else no file could fail on them)."""
        return not self.outputs or len(self.cannot_tell) < self.outputs

    @property
    def passed(self) -> bool:
        return not self.failures and self.told

    @property
    def max_abs_err(self) -> float:
        return max(self.errors, default=0.0)

    def first_failure(self) -> str | None:
        """'sample 3 (line 4): why' of the first failing sample."""
        if not self.failures:
            return None if self.told else f"the comparison cannot tell a right file from a wrong one ({self.why()})"
        i, why = self.failures[0]
        where = self.samples.where[i]
        return f"sample {i}" + ("" if where == f"sample {i}" else f" ({where})") + f": {why}"

    def why(self) -> str:
        """The outputs that cannot tell, in words."""
        return "; ".join(f"PyTorch's '{n}' is {w}" for n, w in list(self.cannot_tell.items())[:4])

    def to_dict(self) -> dict:
        """report.json ``validation.samples``."""
        return {**self.samples.to_dict(), "batch_size": self.batch_size, "passed": self.passed,
                "tolerance": self.tolerance.to_dict(), "max_abs_err": finite(self.max_abs_err),
                "errors": [finite(e) for e in self.errors], "failed": len(self.failures),
                "failing": [i for i, _ in self.failures],
                "failures": [{"index": i, "where": self.samples.where[i], "error": why}
                             for i, why in self.failures[:SHOWN_FAILURES]],
                "metrics": dict(self.metrics), "seconds": round(self.seconds, 3),
                "cannot_tell": dict(self.cannot_tell)}


# --------------------------------------------------------------------------- batching


def batch_size(loaded: LoadedModel, samples: SampleSet, want: int = BATCH) -> int:
    """Samples per run: ``want`` within the batch dim's declared range (1 without a dynamic batch axis)."""
    first = loaded.inputs[0].shape[0] if samples.batched and loaded.inputs[0].shape else None
    if not isinstance(first, str) or first not in loaded.dims:
        return 1
    dim = loaded.dims[first]
    return max(1, dim.snap(min(want, dim.max)))


def _fill_to(loaded: LoadedModel, n: int) -> int:
    """The smallest batch size the model declares that holds ``n`` samples."""
    first = loaded.inputs[0].shape[0]
    dim = loaded.dims.get(first) if isinstance(first, str) else None
    if dim is None or dim.allows(n):
        return n
    return next((s for s in range(n, dim.max + 1) if dim.allows(s)), n)


def _padded_size(loaded: LoadedModel, d: int | str, longest: int) -> int:
    if isinstance(d, int):
        return d
    dim = loaded.dims.get(d)
    if dim is None:
        return longest
    return next((s for s in range(max(longest, dim.min), dim.max + 1) if dim.allows(s)), longest)


def stack(loaded: LoadedModel, samples: SampleSet, indices: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """The samples at ``indices`` as one run's tensors: padded to the longest (at a size the dim allows) with each
    input's pad value, filled up to a declared batch size with copies of the first."""
    if not samples.batched:
        return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in samples.rows[indices[0]])
    picked = list(indices) + [indices[0]] * (_fill_to(loaded, len(indices)) - len(indices))
    out = []
    for k, spec in enumerate(loaded.inputs):
        rows = [samples.rows[i][k] for i in picked]
        dims = row_dims(spec, True)
        shape = [len(rows)] + [_padded_size(loaded, d, max(r.shape[a] for r in rows)) for a, d in enumerate(dims)]
        batch = np.full(shape, samples.pad[k], dtype=rows[0].dtype)
        for j, r in enumerate(rows):
            batch[(j, *(slice(0, n) for n in r.shape))] = r
        t = torch.from_numpy(batch)
        out.append(t.to(torch.bfloat16) if spec.dtype == "bfloat16" else t)
    return tuple(out)


def groups(count: int, size: int) -> list[tuple[int, ...]]:
    """Sample indices in runs of ``size``, in file order."""
    return [tuple(range(start, min(start + size, count))) for start in range(0, count, size)]


def references(loaded: LoadedModel, samples: SampleSet, want: int = BATCH) -> SampleRefs:
    """Every sample in runs of :func:`batch_size`, with PyTorch's outputs."""
    size = batch_size(loaded, samples, want)
    batches = []
    for idx in groups(samples.count, size):
        tensors = stack(loaded, samples, idx)
        (ran,) = run_each(loaded.flat, [tensors])  # PyTorch failing on the user's data: those samples fail
        batches.append(SampleBatch(idx, tensors, None if ran.outputs is None else tuple(ran.outputs),
                                   None if ran.error is None else f"PyTorch itself fails: {ran.error}"))
    return SampleRefs(samples, tuple(batches), size)


# --------------------------------------------------------------------------- judging


def run_onnx(loaded: LoadedModel, sess, refs: SampleRefs) -> list[list[np.ndarray] | str]:
    """ONNX Runtime's outputs per batch, in the model's output order (a string: why the run failed)."""
    feed = FeedMap.of(loaded.inputs, sess)
    names = [o.name for o in sess.get_outputs()]
    by_name = all(n in names for n in loaded.output_names)
    out: list[list[np.ndarray] | str] = []
    for b in refs.batches:
        try:
            got = sess.run(None, feed(b.inputs))
        except Exception as e:  # noqa: BLE001 - reported per sample
            out.append(f"onnxruntime fails: {short_ort_error(str(e))}")
            continue
        if by_name:
            got_by = dict(zip(names, got))
            out.append([np.asarray(got_by[n]) for n in loaded.output_names])
        elif len(got) == len(loaded.output_names):
            out.append([np.asarray(g) for g in got])
        else:
            out.append(f"PyTorch returns {len(loaded.output_names)} outputs, the ONNX model {len(got)}")
    return out


def _row(arrays, j: int, rows: int) -> list[np.ndarray]:
    """Row ``j`` of every output that has the batch axis (the others whole)."""
    return [a[j:j + 1] if a.ndim and a.shape[0] == rows else a for a in arrays]


def judge_rows(loaded: LoadedModel, refs: SampleRefs, got: list, tol: Tolerance
               ) -> tuple[list[float], list[tuple[int, str]]]:
    """(per-sample max abs error, (index, why) of every failing sample), each sample judged alone."""
    errors = [float("inf")] * refs.samples.count
    failures: list[tuple[int, str]] = []
    for b, g in zip(refs.batches, got):
        why = b.error if b.outputs is None else g if isinstance(g, str) else None
        if why is not None:
            failures += [(i, why) for i in b.indices]
            continue
        rows = int(b.inputs[0].shape[0]) if refs.samples.batched else 1
        for j, i in enumerate(b.indices):
            pairs = list(zip(loaded.output_names, _row(b.outputs, j, rows), _row(g, j, rows)))
            _, worst, _, ok, problems = judge(loaded, pairs, tol)
            errors[i] = worst
            if not ok:
                failures.append((i, "; ".join(problems) or "outputs differ"))
    return errors, sorted(failures)


def _compared_rows(loaded: LoadedModel, kind: str, b: SampleBatch, g: list[np.ndarray]):
    """(PyTorch rows, ONNX rows) the task metric compares for one batch, its real samples only."""
    n = len(b.indices)
    if kind == "sentence-embedding":
        i = loaded.output_names.index("last_hidden_state")
        mask = b.inputs[[s.name for s in loaded.inputs].index("attention_mask")].numpy()
        return mean_pool(b.outputs[i], mask)[:n], mean_pool(g[i], mask)[:n]
    r, o = b.outputs[0], g[0]
    if r.ndim == 0 or r.shape != o.shape:
        return None
    return r.reshape(r.shape[0], -1)[:n], o.reshape(o.shape[0], -1)[:n]


def agreement(loaded: LoadedModel, refs: SampleRefs, got: list, tol: Tolerance) -> dict:
    """The task metrics over every sample that ran: ``cosine_min``/``cosine_mean`` (of the mean-pooled embedding for
    encoders with an attention mask, else of the first output's rows) and, for classifiers (2-D logits),
    ``top1_agreement`` and ``topk_agreement`` (k up to 5; ties within the tolerance are no disagreement); the same
    on the rows centred by PyTorch's mean over the samples (``cosine_min_centred``, ``top1_agreement_centred``,
    ``topk_agreement_centred``: None where they cannot tell, ``cannot_tell`` says why), and ``within_own_scale``:
    the share of elements within the tolerance at the output's own scale (:mod:`onnxport.prove.varying`)."""
    kind = next((task_kind(loaded, b.outputs) for b in refs.batches if b.outputs is not None), None)
    if kind is None or not refs.samples.batched:
        return {"task": kind} if kind else {}
    ref_rows, got_rows = [], []
    for b, g in zip(refs.batches, got):
        pair = None if b.outputs is None or isinstance(g, str) else _compared_rows(loaded, kind, b, g)
        if pair is not None:
            ref_rows.append(pair[0])
            got_rows.append(pair[1])
    if not ref_rows:
        return {"task": kind, "rows": 0}
    r, g = np.concatenate(ref_rows), np.concatenate(got_rows)
    cos = row_cosines(r, g)
    out = {"task": kind, "rows": len(r), "cosine_min": float(cos.min()), "cosine_mean": float(cos.mean())}
    if kind == "classifier":
        top = topk_agreement(r, g, tol)
        out.update(top1_agreement=top["top1_agree"], topk_agreement=top["topk_agree"], k=top["k"])
    else:
        out["cosine_passed"] = cosine_agreement(r, g, tol)["passed"]
    v = centred([r], [g], tol, top=kind == "classifier")
    out.update(cosine_min_centred=v.cosine, within_own_scale=v.within, cannot_tell=dict(v.cannot_tell))
    if kind == "classifier":
        out.update(top1_agreement_centred=v.top1, topk_agreement_centred=v.topk)
    return out


def check(loaded: LoadedModel, path: str | Path, refs: SampleRefs, tolerance: Tolerance = FP32,
          sess=None) -> SampleProof:
    """Every sample through ONNX Runtime (``sess`` or a session on ``path``) against PyTorch's outputs in ``refs``."""
    t0 = time.perf_counter()
    sess = sess if sess is not None else session(path)
    got = run_onnx(loaded, sess, refs)
    errors, failures = judge_rows(loaded, refs, got, tolerance)
    return SampleProof(refs.samples, refs.batch_size, tolerance, tuple(errors), tuple(failures),
                       agreement(loaded, refs, got, tolerance), time.perf_counter() - t0,
                       samples_cannot_tell(loaded, refs), len(loaded.output_names))


def samples_cannot_tell(loaded: LoadedModel, refs: SampleRefs) -> dict[str, str]:
    """Per output whose PyTorch rows are the same for every sample (two samples at least), why: comparing it
    cannot tell a right file from a wrong one on these samples."""
    digests: dict[str, set] = {n: set() for n in loaded.output_names}
    count = 0
    for b in refs.batches:
        if b.outputs is None:
            continue
        rows = int(b.inputs[0].shape[0]) if refs.samples.batched else 1
        for j, _ in enumerate(b.indices):
            count += 1
            for name, arr in zip(loaded.output_names, _row(b.outputs, j, rows)):
                digests[name].add(fingerprint(arr))
    if count < 2:
        return {}
    return {n: "the same for every sample" for n, d in digests.items() if len(d) == 1}


def diagnostics(proof: SampleProof) -> list[Diagnostic]:
    """``samples-failed`` when a sample is outside the tolerance (the proof then fails)."""
    if proof.passed:
        return []
    s = proof.samples
    if not proof.failures:
        return [error("samples-cannot-tell", f"the samples of {s.file} cannot tell a right file from a wrong one: "
                      f"{proof.why()}", hint="give samples that differ in what the model sees, or trained weights")]
    return [error("samples-failed",
                  f"{len(proof.failures)} of {s.count} samples of {s.file} differ between PyTorch and ONNX Runtime "
                  f"(atol {proof.tolerance.atol:g}, rtol {proof.tolerance.rtol:g}); first: {proof.first_failure()}",
                  hint="your data reaches values the generated cases did not: run that sample through both and "
                       "compare the outputs; validation.samples lists every failing one")]
