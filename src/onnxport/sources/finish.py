"""What every loader does last: the inputs and dims merged, the model made flat and run once at the export
sizes, the LoadedModel built."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from onnxport.core.diagnostics import Diagnostic, info, warning
from onnxport.core.errors import ConstrainedDims, SourceError, UsageError, one_line
from onnxport.core.samples import export_sizes, make_inputs
from onnxport.core.spec import Dim, InputSpec, merge_dims
from onnxport.sources.base import (
    LoadedModel,
    count_parameters,
    integer_range,
    make_flat,
    names_of,
    to_eval,
)


@dataclass(frozen=True)
class Finishing:
    """What a source knows beyond its inputs and declared dims, for ``finish``.

    ``defaults``: the dim ranges it infers (a --dim overrides them); ``diagnostics``: notes from loading;
    ``extra``: copied into ``LoadedModel.extra``; ``ranges``: value ranges of integer inputs by name (else
    read from the model's embeddings); ``built_here``: onnxport constructed the model (a class, a
    torchvision/timm name), so its train mode at start is only noted, not warned about.
    """

    defaults: dict[str, Dim] | None = None
    diagnostics: tuple[Diagnostic, ...] = ()
    extra: dict[str, Any] | None = None
    ranges: dict[str, tuple[int, int]] | None = None
    built_here: bool = False
    one_size: dict[str, int] | None = None  # sizes a model built for one size takes (its weights' crop size)
    sized: tuple[str, ...] = ()  # default dims narrowed when the proof's largest case would cost too much
    fixed_at: dict[str, int] | None = None  # where those dims (but batch) are fixed when no ranged file is proven


MAX_CASE_FLOPS = 1e12  # the proof's all-max case, estimated from the example forward: about 10 s of one core
MAX_CASE_TENSOR = 2 * 2**30  # its largest tensor (bytes): PyTorch and onnxruntime each hold a few such at once


def finish(source: str, name: str, kind: str, model: nn.Module, specs: list[InputSpec], declared: list[Dim],
           more: Finishing = Finishing()) -> LoadedModel:
    """Common tail of every source: eval mode, value ranges, dims, wrapper, output names."""
    if not specs:
        raise UsageError(
            f"{source} needs --input: onnxport cannot infer the inputs of this model",
            "describe each forward() input, e.g. -i 'x:float32[batch,16]' -d batch=1..64",
        )
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise UsageError("two --input entries share a name", "give every input a distinct NAME")
    diags = tuple(more.diagnostics) + to_eval(model, name, more.built_here)
    ranges = more.ranges or {}
    fixed: list[InputSpec] = []
    for s in specs:
        if s.value_range is None and s.dtype != "bool" and not s.dtype.startswith("float") and s.dtype != "bfloat16":
            s = InputSpec(s.name, s.dtype, s.shape, ranges.get(s.name) or integer_range(model, s))
        fixed.append(s)
    spec_t = tuple(fixed)
    resolved = merge_dims(list(spec_t), declared, more.defaults)
    flat = make_flat(model, spec_t)
    example = make_inputs(spec_t, export_sizes(resolved), seed=0)
    sized = [sym for sym in more.sized if sym in resolved and sym not in {d.symbol for d in declared}]
    try:
        out, flops, largest = _example_run(flat, example, count=bool(sized))
    except Exception as e:  # noqa: BLE001 - a model that cannot run on its own inputs
        first = one_line(e, 300)
        if isinstance(e, IndexError) and "index out of range" in first:
            raise _out_of_range(model, spec_t) from None
        fixed_at = _one_size(flat, spec_t, resolved, more.one_size or {})
        if fixed_at:
            return finish(source, name, kind, model, _fixed(specs, fixed_at), declared, _noted(more, fixed_at))
        _raise_if_constrained(flat, spec_t, resolved, list(resolved))
        raise UsageError(
            f"the model fails on the example inputs ({', '.join(str(s) for s in spec_t)}): {type(e).__name__}: {first}",
            "check --input names, dtypes and fixed sizes against forward(), and --dim ranges",
        ) from None
    outs = _distinct_from_inputs(names_of(out), names)  # the model ran: what follows is about its output
    del out
    if flops:
        resolved, narrowed = sized_by_cost(resolved, sized, flops, largest=largest)
        diags += narrowed
    _preflight(flat, spec_t, resolved)
    extra = dict(more.extra or {})
    at = export_sizes(resolved)  # the weights' crop size where the range holds it (a clip's sides may not)
    at.update({sym: n for sym, n in (more.fixed_at or {}).items() if sym in resolved and resolved[sym].allows(n)})
    fixable = {sym: at[sym] for sym in sized if sym != "batch" and resolved[sym].min != resolved[sym].max}
    if fixable:
        extra[FIXABLE] = fixable
    return LoadedModel(
        source=source, name=name, kind=kind, model=model, flat=flat, inputs=spec_t, dims=resolved,
        output_names=outs, parameters=count_parameters(model), diagnostics=diags, extra=extra,
    )


FIXABLE = "fixable"  # LoadedModel.extra: the made-up dims a file may fix (at_fixed_sizes), with their sizes


def at_fixed_sizes(loaded: LoadedModel, why: str) -> LoadedModel | None:
    """``loaded`` with the dims onnxport made up for it (not batch, none the user declared) fixed at the weights'
    crop size (else their export sizes), for a second export when no file was proven over their ranges (``why``:
    the first file's failure): a Swin's window shift depends on the feature size, so a traced branch holds on one
    side of 224 only, and no exporter keeps it. None when there is no such dim."""
    at = {sym: n for sym, n in (loaded.extra.get(FIXABLE) or {}).items() if sym in loaded.dims}
    if not at:
        return None
    specs = tuple(dataclasses.replace(s, shape=tuple(at.get(d, d) if isinstance(d, str) else d for d in s.shape),
                                      value_range=s.value_range and (s.value_range[0],
                                                                     at.get(s.value_range[1], s.value_range[1])))
                  for s in loaded.inputs)
    told = ", ".join(f"{sym} {n} (not {loaded.dims[sym].min}..{loaded.dims[sym].max})" for sym, n in at.items())
    note = warning("range-fixed", f"no export was proven over the ranges made up for {', '.join(at)} ({why}); "
                   f"exported and proven at {told}",
                   hint="feed the ONNX model inputs of that size (resize or crop them first); --dim "
                        "SYMBOL=MIN..MAX asks for a range again")
    return dataclasses.replace(loaded, inputs=specs, dims={k: d for k, d in loaded.dims.items() if k not in at},
                               flat=make_flat(loaded.model, specs), diagnostics=(*loaded.diagnostics, note),
                               extra={k: v for k, v in loaded.extra.items() if k != FIXABLE})


class _Largest(TorchDispatchMode):
    """The bytes of the largest tensor any operation makes (SAM's ViT: a 4096 x 4096 attention bias per head)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's protocol
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.bytes = max(self.bytes, t.numel() * t.element_size())
        return out


def _example_run(flat: nn.Module, example: list[torch.Tensor], count: bool) -> tuple[Any, int, int]:
    """The model's outputs at the export sizes and, when ``count``, the FLOPs that forward took and the bytes of
    its largest tensor (0, 0 when PyTorch's counter cannot follow the model: the model is then run without it)."""
    with torch.inference_mode():
        if count:
            from torch.utils.flop_counter import FlopCounterMode

            counter, largest = FlopCounterMode(display=False), _Largest()
            try:
                with counter, largest:
                    return flat.raw(*example), int(counter.get_total_flops()), largest.bytes
            except Exception:  # noqa: BLE001 - the counter's failure or the model's: the plain run below tells
                pass
        return flat.raw(*example), 0, 0


def sized_by_cost(dims: dict[str, Dim], syms: list[str], flops: int, budget: float | None = None,
                  largest: int = 0) -> tuple[dict[str, Dim], tuple[Diagnostic, ...]]:
    """``dims`` with the default ranges of ``syms`` narrowed until the proof's all-max case costs about
    ``budget`` FLOPs and its largest tensor :data:`MAX_CASE_TENSOR`, estimated from the example forward's
    ``flops`` and ``largest`` bytes as growing with each dim's size (the declared ones' too, which stay as they
    are): batch down to 4 first, then the other dims evenly, each kept above its export size (a dim that takes
    listed sizes only keeps those up to its new top), the batch last down to its export size; a
    ``range-sized-by-cost`` note says what changed and how to prove the wider range."""
    budget = MAX_CASE_FLOPS if budget is None else budget
    memory = largest * budget / MAX_CASE_TENSOR > flops  # the memory binds before the time
    flops = max(flops, largest * budget / MAX_CASE_TENSOR)  # the largest tensor as the FLOPs it may cost
    sizes = export_sizes(dims)
    syms = [s for s in syms if dims[s].max > sizes[s]]
    held = {s: d.max for s, d in dims.items() if s not in syms and d.max > sizes[s]}  # declared: they cost too

    def cost(tops: dict[str, int]) -> float:
        return flops * math.prod(n / max(sizes[s], 1) for s, n in {**held, **tops}.items())

    def floor(s: str) -> int:
        if dims[s].sizes is not None:
            return min((n for n in dims[s].sizes if n > sizes[s]), default=dims[s].max)
        return min(dims[s].max, sizes[s] + 1 if s == "batch" else -(-(sizes[s] + 1) // 32) * 32)

    def lower(s: str, n: int) -> int:
        if dims[s].sizes is not None:
            return max((k for k in dims[s].sizes if floors[s] <= k < n), default=n)
        return max(floors[s], n - (32 if n - floors[s] >= 32 and sizes[s] >= 32 else 1))

    tops = {s: dims[s].max for s in syms}
    wanted = cost(tops)
    if wanted <= budget:
        return dims, ()
    floors = {s: floor(s) for s in syms}
    if "batch" in tops and dims["batch"].sizes is None:
        tops["batch"] = max(floors["batch"], min(tops["batch"], 4))
    others = [s for s in syms if s != "batch"]
    for _ in range(64):  # each pass takes the sides down a step of 32 (or one, or a listed size), the batch last
        if cost(tops) <= budget:
            break
        movable = [s for s in others if tops[s] > floors[s]] or [s for s in syms if tops[s] > floors[s]]
        if not movable:
            break
        for s in movable:
            tops[s] = lower(s, tops[s])
    if cost(tops) > budget and "batch" in tops and dims["batch"].sizes is None and dims["batch"].min < sizes["batch"]:
        tops["batch"] = sizes["batch"]  # min..export still varies it
    changed = {s: n for s, n in tops.items() if n < dims[s].max}
    if not changed:
        return dims, ()
    new = dict(dims)
    for s, n in changed.items():
        kept = dims[s].sizes and tuple(k for k in dims[s].sizes if k <= n)
        new[s] = dataclasses.replace(dims[s], max=n, sizes=kept or None)
    told = ", ".join(f"{s} {dims[s].min}..{n} (not ..{dims[s].max})" for s, n in changed.items())
    note = info("range-sized-by-cost",
                f"default ranges narrowed to {told}: at the full ranges the proof's largest case would take "
                + (f"an estimated {wanted / budget * MAX_CASE_TENSOR / 2**30:.1f} GiB for its largest tensor, "
                   f"now about {cost(tops) / budget * MAX_CASE_TENSOR / 2**30:.1f}" if memory else
                   f"an estimated {wanted / 1e12:.1f} TFLOPs per run, now about {cost(tops) / 1e12:.1f}"),
                hint="declare the wider range with --dim (for example "
                     f"{' '.join(f'-d {s}={dims[s].min}..{dims[s].max}' for s in changed)}) to prove it")
    return new, (note,)


def _one_size(flat: nn.Module, specs: tuple[InputSpec, ...], dims: dict[str, Dim],
              sizes: dict[str, int]) -> dict[str, tuple[int, tuple[int, ...]]]:
    """The dims of ``sizes`` the model takes at that size only, each with the sizes it failed at: when it runs
    with them there (the others at their example sizes) and fails with any one of them at other sizes (32 more
    or less, the range's ends: a size a stride rounds to the same one runs too)."""
    sizes = {sym: n for sym, n in sizes.items() if sym in dims and dims[sym].allows(n)}
    base = dict(export_sizes(dims), **sizes)
    if not sizes or not _runs(flat, specs, base):
        return {}
    found: dict[str, tuple[int, tuple[int, ...]]] = {}
    for sym, n in sizes.items():
        d = dims[sym]
        others = [m for m in dict.fromkeys((n + 32, n - 32, d.min, d.max)) if m != n and d.allows(m)]
        if others and not any(_runs(flat, specs, {**base, sym: m}) for m in others):
            found[sym] = (n, tuple(others))
    return found if len(found) == len(sizes) else {}


def _fixed(specs: list[InputSpec], at: dict[str, tuple[int, tuple[int, ...]]]) -> list[InputSpec]:
    """``specs`` with each dim of ``at`` written as its one size."""
    return [InputSpec(s.name, s.dtype, tuple(at[d][0] if d in at else d for d in s.shape), s.value_range)
            for s in specs]


def _noted(more: Finishing, at: dict[str, tuple[int, tuple[int, ...]]]) -> Finishing:
    """``more`` with a ``one-size`` warning naming the size each dim of ``at`` is fixed at."""
    told = ", ".join(f"{sym} {n} (fails at {', '.join(map(str, fails))})" for sym, (n, fails) in at.items())
    note = warning("one-size", f"the PyTorch model runs at one size only: {told}; exported and proven at that size",
                   hint="feed the ONNX model inputs of that size (resize or crop them first)")
    return dataclasses.replace(more, diagnostics=(*more.diagnostics, note), one_size=None)


def _distinct_from_inputs(outs: tuple[str, ...], inputs: list[str]) -> tuple[str, ...]:
    """Output names that no input has (ONNX names every value once: a UNet's input ``sample`` and its output
    ``sample`` would make an invalid graph); a clashing output gets ``_out`` appended."""
    taken = set(inputs)
    fixed = []
    for name in outs:
        new = name
        while new in taken:
            new += "_out"
        taken.add(new)
        fixed.append(new)
    return tuple(fixed)


def _out_of_range(model: nn.Module, specs: tuple[InputSpec, ...]) -> UsageError:
    """The integer inputs' value ranges exceed an Embedding's rows: name both."""
    emb = [(n, m.num_embeddings) for n, m in model.named_modules() if isinstance(m, nn.Embedding)]
    ints = [s for s in specs if s.value_range is not None]
    where = ", ".join(f"{n} ({k} rows, ids 0..{k - 1})" for n, k in emb[:3]) or "an index-taking op"
    ranges = ", ".join(f"'{s.name}' {{{s.value_range[0]}..{s.value_range[1]}}}" for s in ints)
    err = UsageError(f"integer inputs {ranges} index past {where}",
                     "give the input the range the model accepts, e.g. -i 'input_ids:int64[batch,seq]{0..N-1}' "
                     "with N the embedding's size")
    err.code = "int-out-of-range"
    return err


def _preflight(flat: nn.Module, specs: tuple[InputSpec, ...], dims: dict[str, Dim]) -> None:
    """Vary each dynamic dim once at a small size: a dim the model cannot vary is a usage error. Every dim that
    fails is probed together (one ConstrainedDims naming them all: the source is loaded again once, not once
    per dim)."""
    base = export_sizes(dims)
    failed: dict[str, tuple[int, Exception]] = {}
    for sym, d in dims.items():
        odd = base[sym] + 1 if d.allows(base[sym] + 1) else base[sym] - 1
        alts = [n for n in dict.fromkeys((d.min, odd)) if n != base[sym] and d.allows(n)]
        if not alts:
            alts = [n for n in (d.max,) if n != base[sym] and d.allows(n)]
        for alt in alts:  # the smallest size and an odd one: a rule on the size shows at one of them
            try:
                with torch.inference_mode():
                    flat(*make_inputs(specs, dict(base, **{sym: alt}), seed=0))
            except Exception as e:  # noqa: BLE001
                failed[sym] = (alt, e)
                break
    if not failed:
        return
    _raise_if_constrained(flat, specs, dims, list(failed))
    sym, (alt, e) = next(iter(failed.items()))
    first = one_line(e, 200, typed=True)
    where = ", ".join(f"'{s.name}' axis {s.shape.index(sym)}" for s in specs if sym in s.shape)
    raise UsageError(
        f"dim '{sym}' ({where}) cannot vary: the PyTorch model fails with {sym}={alt} "
        f"but runs with {sym}={base[sym]} ({first})",
        f"give that axis a fixed size in --input (e.g. {base[sym]}) or narrow the range with --dim",
    )


PROBES = 64  # sizes tried per dim when the model fails at some


def _candidates(d: Dim) -> list[int]:
    """Sizes to probe in ``d``'s range: all of a small range; else the small ones, squares, powers of two,
    multiples of 8 and the top."""
    if d.max - d.min < PROBES:
        return list(range(d.min, d.max + 1))
    pool = set(range(d.min, d.min + 12)) | {d.max, d.max - 1}
    pool |= {k * k for k in range(1, int(d.max ** 0.5) + 1)} | {2 ** k for k in range(d.max.bit_length())}
    pool |= {8 * k for k in range(1, 9)}
    pool |= {d.min + (d.max - d.min) * k // 8 for k in range(9)}
    return sorted(n for n in pool if d.min <= n <= d.max)[:PROBES]


def _runs(flat: nn.Module, specs: tuple[InputSpec, ...], sizes: dict[str, int]) -> bool:
    try:
        with torch.inference_mode():
            flat(*make_inputs(specs, sizes, seed=0))
        return True
    except Exception:  # noqa: BLE001 - probing: any failure means "does not run at these sizes"
        return False


def rule_of(runs: tuple[int, ...], fails: tuple[int, ...]) -> tuple[str, Callable[[int], bool]] | None:
    """The rule the sizes that run follow (its name and test), when one fits every probe: multiples of k,
    perfect squares, powers of two, every size from a least one up."""
    tried = sorted(runs + fails)
    for name, test in (("perfect squares", lambda n: math.isqrt(n) ** 2 == n),
                       ("powers of two", lambda n: n & (n - 1) == 0)):
        if all(test(n) == (n in runs) for n in tried):
            return name, test
    step = math.gcd(*runs)
    if step > 1 and all((n % step == 0) == (n in runs) for n in tried):
        return f"multiples of {step}", lambda n: n % step == 0
    low = min(runs)
    if len(runs) > 1 and any(n < low for n in fails) and all((n >= low) == (n in runs) for n in tried):
        return f"at least {low}", lambda n: n >= low  # a size too small for the strides (AlexNet below 63)
    return None


def working_sizes(d: Dim, runs: tuple[int, ...], fails: tuple[int, ...]) -> tuple[int, ...]:
    """The sizes of ``d``'s range that follow the rule of ``runs`` (every one, not only those probed), else
    the sizes that ran."""
    rule = rule_of(runs, fails)
    if rule is None:
        return runs
    return tuple(n for n in range(d.min, d.max + 1) if rule[1](n)) or runs


def _pattern(runs: tuple[int, ...], fails: tuple[int, ...]) -> str:
    """A name for the sizes that run, when one fits every probe."""
    rule = rule_of(runs, fails)
    return f" ({rule[0]})" if rule else ""


def _round_base(flat: nn.Module, specs: tuple[InputSpec, ...], dims: dict[str, Dim],
                base: dict[str, int]) -> dict[str, int] | None:
    """Sizes near ``base`` that are multiples of 64, 32, …, 2 (each dim inside its range) at which the model
    runs, when it fails at ``base`` itself (strided models take multiples of their stride only)."""
    for k in (64, 32, 16, 8, 4, 2):
        sizes = dict(base)
        for sym, d in dims.items():
            near = [m for m in (base[sym] // k * k, (base[sym] // k + 1) * k) if d.allows(m) and m >= 2]
            if near:
                sizes[sym] = min(near, key=lambda m: abs(m - base[sym]))
        if sizes != base and _runs(flat, specs, sizes):
            return sizes
    return None


def _raise_if_constrained(flat: nn.Module, specs: tuple[InputSpec, ...], dims: dict[str, Dim],
                          suspects: list[str]) -> None:
    """Probe each suspect dim over its range (the others at a size that runs): when some sizes run and some
    fail, raise ConstrainedDims with both lists. Returns when no dim explains the failure."""
    base = export_sizes(dims)
    if not _runs(flat, specs, base):  # the example itself fails: probe around sizes that run, if round ones do
        base = _round_base(flat, specs, dims, base) or base
    probed: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for _ in range(2):  # a second pass once the first found sizes that run for the other dims
        before = dict(base)
        for sym in suspects:
            d = dims[sym]
            if d.min == d.max or d.sizes:
                continue
            results = {n: _runs(flat, specs, {**base, sym: n}) for n in _candidates(d)}
            runs = tuple(n for n, ok in results.items() if ok)
            fails = tuple(n for n, ok in results.items() if not ok)
            if len(runs) >= 2 and fails:  # one size only: the dim cannot vary (the caller says so)
                probed[sym] = (runs, fails)
                if base[sym] not in runs:
                    base[sym] = min((n for n in runs if n >= 2), key=lambda n: abs(n - base[sym]), default=runs[0])
        if base == before or (probed and _runs(flat, specs, base)):
            break  # nothing ran at another size (no second pass can differ), or the sizes found run together
    if not probed:
        return
    parts = []
    for sym, (runs, fails) in probed.items():
        shown = ", ".join(map(str, runs[:10])) + (", …" if len(runs) > 10 else "")
        bad = ", ".join(map(str, fails[:8])) + (", …" if len(fails) > 8 else "")
        parts.append(f"{sym}: runs at {shown}; fails at {bad}{_pattern(runs, fails)}")
    example = " ".join(f"-d {sym}={','.join(map(str, runs[:8]))}" for sym, (runs, _) in probed.items())
    raise ConstrainedDims(f"the PyTorch model runs at some sizes only: {'; '.join(parts)}",
                          f"leave out --strict-dims to prove at the sizes that run, or declare them, e.g. {example}",
                          probed, {sym: rule[0] for sym, (runs, fails) in probed.items()
                                   if (rule := rule_of(runs, fails))},
                          {sym: working_sizes(dims[sym], runs, fails) for sym, (runs, fails) in probed.items()})


def declared_or(inputs: list[InputSpec], default: list[InputSpec]) -> list[InputSpec]:
    """User --input wins over the inputs a source infers."""
    return inputs if inputs else default


def ensure_module(obj: Any, where: str) -> nn.Module:
    if isinstance(obj, nn.Module):
        return obj
    raise SourceError(f"{where} gave a {type(obj).__name__}, not a torch.nn.Module",
                      "point SOURCE at an nn.Module class or a function that returns one")
