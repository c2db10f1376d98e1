"""What every source produces: a LoadedModel wrapping the user's module behind flat tensor I/O."""

from __future__ import annotations

import contextlib
import inspect
import keyword
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from onnxport.core.diagnostics import Diagnostic, info, warning
from onnxport.core.errors import SourceError, UsageError, one_line
from onnxport.core.spec import Dim, InputSpec

T = TypeVar("T")


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to export: the user's module (eval mode) and its flat-I/O wrapper."""

    source: str
    name: str
    kind: str
    model: nn.Module
    flat: nn.Module  # FlatModel: forward(*inputs in spec order) -> tuple of tensors
    inputs: tuple[InputSpec, ...]
    dims: dict[str, Dim]
    output_names: tuple[str, ...]
    parameters: int
    diagnostics: tuple[Diagnostic, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)  # facts of the source (model type, …), set at load only
    compare: dict[str, str] = field(default_factory=dict)  # output -> how parity judges it (exact when absent)


_MEMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def memoized(loaded: LoadedModel, name: str, compute: Callable[[], T]) -> T:
    """``compute()`` once per model, declared inputs and dims — what a stage learns by running the model (the
    autograd.Functions it calls, the RNNs fed packed sequences) — kept beside the module, never in the record."""
    per_model = _MEMO.setdefault(loaded.model, {})
    key = (name, repr(loaded.inputs), repr(sorted(loaded.dims.items())))
    if key not in per_model:
        per_model[key] = compute()
    return per_model[key]


# --------------------------------------------------------------------------- binding


def forward_parameters(model: nn.Module) -> list[inspect.Parameter] | None:
    """The parameters of ``model.forward`` (None when they cannot be read, e.g. TorchScript)."""
    if isinstance(model, torch.jit.ScriptModule):
        return None
    try:
        return list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return None


def required_positional(model: nn.Module) -> list[str]:
    """The names of ``forward``'s positional parameters without a default (none when they cannot be read)."""
    return [p.name for p in forward_parameters(model) or ()
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def bind_inputs(model: nn.Module, specs: tuple[InputSpec, ...]) -> list[tuple[str, str | int]]:
    """Decide how each input reaches ``forward``: ("kw", parameter name) or ("pos", sort key).

    An input whose name equals a parameter binds to it by keyword; the others fill the remaining
    positional parameters in order (passed by keyword where the parameter allows it, which avoids
    "got multiple values" clashes with keyword-bound inputs), then ``*args``. Once an input goes to
    ``*args``, every positional parameter is passed positionally, in signature order.
    """
    params = forward_parameters(model)
    if params is None or hasattr(model, "_in_spec"):  # TorchScript, ExportedProgram modules: positional only
        return [("pos", i) for i in range(len(specs))]
    by_name = {p.name: p for p in params}
    index = {p.name: k for k, p in enumerate(params)}
    has_var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    binding: list[tuple[str, str | int] | None] = [None] * len(specs)
    taken: set[str] = set()
    for i, s in enumerate(specs):
        p = by_name.get(s.name)
        if p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            binding[i] = ("kw", p.name)
            taken.add(p.name)
    free = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in taken]
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in params)
    used_var_pos = False
    for i, s in enumerate(specs):
        if binding[i] is not None:
            continue
        if free:
            p = free.pop(0)
            taken.add(p.name)
            binding[i] = ("kw", p.name) if p.kind is p.POSITIONAL_OR_KEYWORD else ("pos", index[p.name])
        elif var_pos:
            binding[i] = ("pos", len(params) + i)
            used_var_pos = True
        elif has_var_kw:
            binding[i] = ("kw", s.name)
        else:
            names = ", ".join(p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))
            raise UsageError(
                f"input '{s.name}' does not fit forward({names})",
                "give one --input per forward() parameter; a NAME equal to a parameter binds to it",
            )
    if used_var_pos:
        binding = [("pos", index[b[1]]) if b and b[0] == "kw" and by_name.get(str(b[1])) is not None
                   and by_name[str(b[1])].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD else b for b in binding]
    missing = [
        p.name for p in params
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in taken
    ]
    if missing:
        raise UsageError(
            f"forward() needs {', '.join(missing)}, which no --input provides",
            "add an --input for each required forward() parameter, e.g. -i '" + missing[0] + ":float32[batch,16]'",
        )
    return [b for b in binding if b is not None]


def _identifier(name: str, i: int) -> str:
    ok = name.isidentifier() and not keyword.iskeyword(name) and name not in ("self", "model")
    return name if ok else f"arg{i}"


_KEPT = {"_parameters", "_buffers", "_modules", "training"}  # what as_found never touches
_MISSING = object()


class _FlatBase(nn.Module):
    """Calls the user's model with bound inputs and returns its tensors as a flat tuple."""

    def __init__(self, model: nn.Module, binding: list[tuple[str, str | int]]) -> None:
        super().__init__()
        self.model = model
        self._binding = binding
        self._found = [(m, {k: v for k, v in vars(m).items() if k not in _KEPT}) for m in model.modules()]

    def as_found(self) -> None:
        """Each module's attributes as they were before any run: a forward that caches what it computed from
        the input's shape (anchors, grids: ``if self.shape != shape: self.anchors = ...``) would otherwise hand
        an export the cache of the last check run as a constant, where a first forward computes it in the graph.
        Parameters, buffers and submodules are left as they are."""
        for m, before in self._found:
            now = vars(m)
            for k in [k for k in now if k not in before and k not in _KEPT]:
                del now[k]
            for k, v in before.items():
                if now.get(k, _MISSING) is not v:
                    now[k] = v

    def train(self, mode: bool = True) -> _FlatBase:
        """Keep the wrapper and the user's model in the same mode (exporters toggle it and restore it)."""
        self.training = mode
        with contextlib.suppress(NotImplementedError):  # an ExportedProgram's module: mode fixed at export
            self.model.train(mode)
        return self

    def raw(self, *tensors: torch.Tensor) -> Any:
        """The model's own (possibly nested) output for inputs in spec order."""
        positional, kwargs = [], {}
        for (how, key), t in zip(self._binding, tensors):
            if how == "kw":
                kwargs[key] = t
            else:
                positional.append((key, t))
        return self.model(*[t for _, t in sorted(positional, key=lambda kv: kv[0])], **kwargs)

    def call(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        leaves = torch.utils._pytree.tree_leaves(self.raw(*tensors))
        return tuple(x for x in leaves if isinstance(x, torch.Tensor))


def make_flat(model: nn.Module, specs: tuple[InputSpec, ...]) -> nn.Module:
    """Wrap ``model`` so that forward takes the inputs in spec order, named like the specs."""
    binding = bind_inputs(model, specs)
    params = [_identifier(s.name, i) for i, s in enumerate(specs)]
    if len(set(params)) != len(params):
        raise UsageError("two --input entries share a name", "give every input a distinct NAME")
    src = f"def forward(self, {', '.join(params)}):\n    return self.call({', '.join(params)})\n"
    namespace: dict[str, Any] = {}
    exec(src, namespace)  # a real signature lets torch.export name the ONNX inputs after the specs
    cls = type("FlatModel", (_FlatBase,), {"forward": namespace["forward"]})
    flat = cls(model, binding)
    flat.training = model.training  # a new nn.Module starts in train mode; the wrapper follows the model
    return flat


# --------------------------------------------------------------------------- outputs


def output_names(flat: nn.Module, example: tuple[torch.Tensor, ...]) -> tuple[str, ...]:
    """Stable names for the flattened outputs of ``flat`` run on ``example`` (see :func:`names_of`)."""
    with torch.inference_mode():
        out = flat.raw(*example)
    return names_of(out)


def names_of(out: Any) -> tuple[str, ...]:
    """Stable names for the tensors of a model's output, in the order :meth:`_FlatBase.call` returns them: dict
    keys / attribute names / indices joined by '_' (``output`` alone for a single tensor)."""
    if isinstance(out, torch.Tensor):
        return ("output",)
    names: list[str] = []
    for path, leaf in tensor_paths(out):
        if not isinstance(leaf, torch.Tensor):
            continue
        parts = list(path)
        if not parts or parts[0].isdigit():
            parts.insert(0, "output")
        name = "_".join(parts)
        while name in names:
            name += "_"
        names.append(name)
    if not names:
        raise SourceError("the model returned no tensors", "forward() must return a tensor or a structure of tensors")
    return tuple(names)


def tensor_paths(tree: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """The leaves of a pytree with their key paths as text, in ``tree_leaves`` order.

    Unlike ``tree_flatten_with_path``, a node registered without a ``flatten_with_keys_fn`` (diffusers'
    ``BaseOutput``, any ``register_pytree_node`` call that gave none) is no error: its children are named by
    its context when that is one name per child (a dict-like node's keys), else by their index."""
    pytree = torch.utils._pytree
    node = pytree.SUPPORTED_NODES.get(pytree._get_node_type(tree))
    if node is None or isinstance(tree, torch.Tensor):
        return [(path, tree)]
    out: list[tuple[tuple[str, ...], Any]] = []
    if node.flatten_with_keys_fn is not None:
        pairs, _ = node.flatten_with_keys_fn(tree)
        for key, child in pairs:
            out += tensor_paths(child, (*path, _key_text(key)))
        return out
    children, context = node.flatten_fn(tree)
    keys: list[Any] = list(range(len(children)))
    if isinstance(context, (list, tuple)) and len(context) == len(children) and \
            all(isinstance(k, (str, int)) for k in context):
        keys = list(context)
    for key, child in zip(keys, children):
        out += tensor_paths(child, (*path, str(key)))
    return out


def _key_text(key: Any) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


# --------------------------------------------------------------------------- helpers


def count_parameters(model: nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen and t.is_floating_point():
            seen.add(id(t))
            total += t.numel()
    return total


def to_eval(model: nn.Module, name: str, built_here: bool = False) -> tuple[Diagnostic, ...]:
    """Put ``model`` in eval mode; warn when it was training with Dropout/BatchNorm inside.

    A model that onnxport itself constructed (a class, a torchvision/timm name) starts in train mode as every
    new nn.Module does, so that case is only noted (severity info); a model handed over in train mode is a
    warning, since the user's own inference code would likely forget ``model.eval()`` too.
    """
    diags: list[Diagnostic] = []
    if model.training:
        affected = [
            (n or name, type(m).__name__)
            for n, m in model.named_modules()
            if isinstance(m, (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
                              nn.modules.batchnorm._BatchNorm))
        ]
        if affected:
            listed = ", ".join(f"{n} ({t})" for n, t in affected[:4]) + (" ..." if len(affected) > 4 else "")
            if built_here:
                diags.append(info("train-mode", f"built in train mode, as every new nn.Module is; switched to eval "
                                                f"mode ({len(affected)} Dropout/BatchNorm module(s))",
                                  module=affected[0][0]))
            else:
                diags.append(warning(
                    "train-mode",
                    f"the model was in train mode with {len(affected)} Dropout/BatchNorm module(s): {listed}; "
                    "onnxport switched it to eval mode for export",
                    module=affected[0][0],
                    hint="call model.eval() before exporting yourself; in train mode Dropout is random and "
                         "BatchNorm uses batch statistics, so an export would not match inference",
                ))
    try:
        model.eval()
    except NotImplementedError:  # an ExportedProgram's module: its mode was fixed when it was exported
        return ()
    return tuple(diags)


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Load a state_dict (.pt/.pth via torch.load(weights_only=True), or .safetensors) into ``model``."""
    p = Path(path)
    if p.is_dir():
        raise SourceError(f"--weights {p} is a folder", "give the weights file itself (.pt, .pth or .safetensors)")
    if not p.is_file():
        raise SourceError(f"weights file not found: {p}", "check the --weights path")
    try:
        if p.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(p))
        else:
            state = torch.load(str(p), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
        raise SourceError(f"cannot read weights from {p}: {_weights_reason(e)}",
                          "--weights takes a state_dict saved with torch.save(model.state_dict(), ...) or a "
                          ".safetensors file; onnxport reads it safely (torch.load with weights_only=True)") from None
    if isinstance(state, dict):
        for key in ("state_dict", "model_state_dict", "model"):
            if key in state and isinstance(state[key], dict):
                state = state[key]
                break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise SourceError(f"{p} does not hold a state_dict of tensors",
                          "save it with torch.save(model.state_dict(), path)")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise SourceError(f"the weights in {p.name} do not fit the model: {one_line(e, 300)}",
                          "check --model-args: they must build the architecture the weights were saved from") from None


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _weights_reason(e: Exception) -> str:
    """Why a weights file could not be read, in our words: torch's and numpy's advice to load the file unsafely
    (which onnxport never does) is left out, and so are terminal colour codes."""
    text = _ANSI.sub("", str(e))
    if "Weights only load failed" in text or "weights_only" in text:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
        what = f" (it holds a {found.group(1)})" if found else ""
        return f"the file holds Python objects, not only tensors{what}"
    if "pickle" in text.lower() and "allow_pickle" in text:
        return "the file holds pickled Python objects"
    return one_line(text.splitlines()[0] if text.strip() else type(e).__name__, 200)


def integer_range(model: nn.Module, spec: InputSpec) -> tuple[int, int]:
    """A safe value range for an integer input: masks 0..1, ids below the first Embedding's size."""
    low = spec.name.lower()
    if spec.dtype == "bool" or "mask" in low:
        return (0, 1)
    for m in model.modules():
        if isinstance(m, nn.Embedding):
            return (0, m.num_embeddings - 1)
    return (0, 9)
