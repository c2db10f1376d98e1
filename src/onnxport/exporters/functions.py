"""Custom operators: ``autograd.Function`` subclasses with a ``symbolic`` and their ONNX Runtime implementations.

Export side. The TorchScript exporter honours ``symbolic(g, ...)`` by itself. The dynamo exporter traces
through the Function, so for it each Function the model uses becomes an opaque ``torch.library`` op while
exporting, and its ``custom_translation_table`` entry replays the user's ``symbolic`` with a ``g`` whose
``g.op("Gelu", x)`` / ``g.op("custom_domain::MyCustomOp", x, alpha_f=a)`` emits the same ONNX node.
Nothing to register: the Functions are discovered by running the model once.

Runtime side. A node in a custom domain needs an implementation in ONNX Runtime, either

* a compiled custom-op library (``add_library("libmyops.so")``, CLI ``--custom-op-library``), loaded into
  every session through ``SessionOptions.register_custom_ops_library``, or
* a Python function registered with :func:`ort_python_op` (runs through onnxruntime-extensions).

Every ONNX Runtime session onnxport opens (parity, variants, bench, serve) goes through
:func:`prepare_session`, so the proof runs through the registered implementation.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxport.core.errors import ExportFailed
from onnxport.core.samples import export_sizes, make_inputs
from onnxport.runtime.ops import split_name
from onnxport.sources.base import memoized

NAMESPACE = "onnxport_custom"
_ATTR_SUFFIXES = {"f": "FLOAT", "i": "INT", "s": "STRING", "t": "TENSOR", "fs": "FLOATS", "is": "INTS",
                  "ss": "STRINGS", "ts": "TENSORS"}


# --------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class CustomFunction:
    """One ``autograd.Function`` with a ``symbolic`` as the model calls it."""

    cls: type
    kinds: tuple[str, ...]  # schema type of each argument: Tensor, float, int, bool, str, int[], float[]
    n_outputs: int
    onnx_ops: tuple[str, ...]  # what symbolic emits, e.g. ("Gelu",) or ("custom_domain::MyCustomOp",)

    @property
    def name(self) -> str:
        """``file.py:Class`` (the module name of a file onnxport imported means nothing to the user)."""
        try:
            where = Path(inspect.getsourcefile(self.cls) or "").name or self.cls.__module__
        except TypeError:
            where = self.cls.__module__
        return f"{where}:{self.cls.__qualname__}"

    @property
    def op_name(self) -> str:
        """Name of the opaque torch.library op standing in for the Function while the dynamo exporter runs."""
        base = "".join(c if c.isalnum() else "_" for c in self.cls.__qualname__)
        sig = "".join(k[0] + ("s" if k.endswith("[]") else "") for k in self.kinds)
        return f"{base}_{sig}_{self.n_outputs}_{abs(hash(self.cls)) % 10**8}"

    @property
    def domains(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(op.split("::")[0] for op in self.onnx_ops if "::" in op))

    def to_dict(self) -> dict:
        return {"function": self.name, "onnx_ops": list(self.onnx_ops), "arguments": list(self.kinds),
                "outputs": self.n_outputs}


def _symbolic_functions() -> list[type]:
    """Every loaded ``autograd.Function`` subclass outside torch that defines ``symbolic``."""
    import torch

    found, todo = [], list(torch.autograd.Function.__subclasses__())
    seen: set[type] = set()
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo.extend(cls.__subclasses__())
        if not cls.__module__.startswith("torch.") and callable(getattr(cls, "symbolic", None)):
            found.append(cls)
    return found


def _kind(value: Any) -> str | None:
    import torch

    if isinstance(value, torch.Tensor):
        return "Tensor"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) and not isinstance(v, bool)
                                                          for v in value):
        return "int[]"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (int, float)) for v in value):
        return "float[]"
    return None  # None, nested structures, objects: the call cannot become one ONNX node


_APPLY_KEY = "apply"


def _base_apply(cls: type) -> Callable:
    """``cls.apply`` as torch defines it, whatever is patched onto the class."""
    import torch

    return torch.autograd.Function.__dict__[_APPLY_KEY].__get__(None, cls)


def discover(module, args: Sequence) -> tuple[CustomFunction, ...]:
    """The Functions with a ``symbolic`` that ``module(*args)`` calls (one run of the model, none if no such
    Function is loaded at all)."""
    import torch

    candidates = set(_symbolic_functions())
    if not candidates:
        return ()
    calls: dict[tuple, CustomFunction] = {}
    saved = {cls: cls.__dict__.get(_APPLY_KEY) for cls in candidates}

    def recorder(cls, *a):
        out = _base_apply(cls)(*a)
        outs = out if isinstance(out, tuple) else (out,)
        kinds = tuple(_kind(v) for v in a)
        key = (cls, kinds, len(outs))
        if None not in kinds and all(isinstance(o, torch.Tensor) for o in outs) and key not in calls:
            calls[key] = CustomFunction(cls, kinds, len(outs), _record_ops(cls, a))  # type: ignore[arg-type]
        return out

    try:
        for cls in candidates:
            cls.apply = classmethod(recorder)
        with torch.inference_mode():
            module(*args)
    except Exception:  # noqa: BLE001 - a model that cannot run here fails in parity, with the reason
        return ()
    finally:
        _restore_apply(saved)
    return tuple(calls.values())


def _restore_apply(saved: dict[type, Any]) -> None:
    """Put back each class's own ``apply`` (or remove the patched one when it had none of its own)."""
    for cls, old in saved.items():
        if old is None:
            with contextlib.suppress(AttributeError):
                delattr(cls, _APPLY_KEY)
        else:
            setattr(cls, _APPLY_KEY, old)


def discover_loaded(loaded) -> tuple[CustomFunction, ...]:
    """:func:`discover` on a LoadedModel at its export sizes (once per model: sources.base.memoized)."""
    return memoized(loaded, "custom_functions", lambda: discover(
        loaded.flat, make_inputs(loaded.inputs, export_sizes(loaded.dims), seed=0)) if _symbolic_functions() else ())


# --------------------------------------------------------------------------- the symbolic's g




def _split_attr(key: str) -> tuple[str, str]:
    """``alpha_f`` -> ("alpha", "FLOAT"); a key without a known suffix is typed from its value later."""
    base, _, suffix = key.rpartition("_")
    if base and suffix in _ATTR_SUFFIXES:
        return base, _ATTR_SUFFIXES[suffix]
    return key, ""


class _Placeholder:
    def __init__(self, name: str) -> None:
        self.name = name


class _RecordingGraph:
    """A ``g`` that only writes down which ONNX ops ``symbolic`` emits."""

    def __init__(self) -> None:
        self.ops: list[str] = []

    def op(self, name: str, *inputs, outputs: int = 1, **attrs):
        domain, op_type = split_name(name)
        self.ops.append(f"{domain}::{op_type}" if domain else op_type)
        return tuple(_Placeholder(f"{op_type}_{i}") for i in range(outputs)) if outputs > 1 else _Placeholder(op_type)


def _record_ops(cls: type, args: Sequence) -> tuple[str, ...]:
    import torch

    g = _RecordingGraph()
    with contextlib.suppress(Exception):  # a symbolic that inspects its inputs deeply still exports
        cls.symbolic(g, *[_Placeholder(f"in{i}") if isinstance(a, torch.Tensor) else a for i, a in enumerate(args)])
    return tuple(g.ops)


def _attr_value(value: Any, kind: str):
    import torch

    if isinstance(value, torch.Tensor):
        import onnx

        return onnx.numpy_helper.from_array(value.detach().cpu().numpy())
    if kind == "FLOAT":
        return float(value)
    if kind == "INT":
        return int(value)
    if kind == "FLOATS":
        return [float(v) for v in value]
    if kind == "INTS":
        return [int(v) for v in value]
    return value


def _guess_attr_type(value: Any) -> str:
    if isinstance(value, bool | int):
        return "INT"
    if isinstance(value, float):
        return "FLOAT"
    if isinstance(value, str):
        return "STRING"
    if isinstance(value, (list, tuple)):
        return "INTS" if all(isinstance(v, int) for v in value) else "FLOATS"
    return "TENSOR"


class OnnxScriptGraph:
    """The ``g`` a ``symbolic`` sees inside the dynamo exporter: ``g.op`` emits the node through onnxscript."""

    def __init__(self, opset: int, custom_versions: dict[str, int] | None = None) -> None:
        self.opset = opset
        self.custom_versions = custom_versions or {}

    def op(self, name: str, *inputs, outputs: int = 1, **attrs):
        import onnx.defs as defs
        from onnxscript import values

        domain, op_type = split_name(name)
        typed = {}
        for key, value in attrs.items():
            attr, kind = _split_attr(key)
            typed[attr] = (kind or _guess_attr_type(value), value)
        if domain == "":
            try:
                schema = defs.get_schema(op_type, self.opset, "")
            except Exception:  # noqa: BLE001 - onnx raises SchemaError
                schema = None
            if schema is None or schema.deprecated:
                raise ExportFailed(f"symbolic emits '{op_type}', which opset {self.opset} does not define",
                                   "pass a newer --opset (e.g. 20 for Gelu)")
            version = self.opset
        else:
            version = self.custom_versions.get(domain, 1)
            schema = _custom_schema(domain, op_type, version, len(inputs), outputs, typed)
        op = values.Op(values.Opset(domain, version), op_type, schema)
        return op(*inputs, **{k: _attr_value(v, kind) for k, (kind, v) in typed.items()})


def _custom_schema(domain: str, op_type: str, version: int, n_in: int, n_out: int, attrs: dict):
    """An ONNX OpSchema for a custom-domain node, built from how ``symbolic`` calls it."""
    import onnx.defs as defs

    param = defs.OpSchema.FormalParameter
    types = [f"tensor({t})" for t in ("float", "double", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                                       "uint8", "bool", "string")]
    return defs.OpSchema(
        op_type, domain, version,
        inputs=[param(f"input{i}", f"T{i}") for i in range(n_in)],
        outputs=[param(f"output{i}", f"U{i}") for i in range(n_out)],
        type_constraints=[(f"T{i}", types, "") for i in range(n_in)] + [(f"U{i}", types, "") for i in range(n_out)],
        attributes=[defs.OpSchema.Attribute(k, getattr(defs.OpSchema.AttrType, kind), "")
                    for k, (kind, _) in attrs.items()],
    )


_PY_TYPES = {"float": float, "int": int, "bool": bool, "str": str, "int[]": Sequence[int], "float[]": Sequence[float]}


def translation(fn: CustomFunction, opset: int) -> Callable:
    """The ``custom_translation_table`` function for ``fn``: replays its ``symbolic`` through onnxscript."""
    g = OnnxScriptGraph(opset)

    def translate(*args):
        return fn.cls.symbolic(g, *args)

    params, notes = [], {}
    for i, kind in enumerate(fn.kinds):
        params.append(inspect.Parameter(f"a{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD))
        if kind != "Tensor":
            notes[f"a{i}"] = _PY_TYPES[kind]  # annotated parameters become attributes, the others inputs
    translate.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    translate.__annotations__ = notes
    translate.__name__ = fn.op_name
    return translate


# --------------------------------------------------------------------------- opaque ops for the dynamo exporter


_LIBRARY: Any = None
_DEFINED: set[str] = set()
_SCHEMA_TYPES = {"Tensor": "Tensor", "float": "float", "int": "SymInt", "bool": "bool", "str": "str",
                 "int[]": "SymInt[]", "float[]": "float[]"}


def _define(fn: CustomFunction):
    """The torch.library op standing in for ``fn`` (defined once per process)."""
    import torch

    global _LIBRARY
    if _LIBRARY is None:
        _LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
    name = fn.op_name
    if name not in _DEFINED:
        args = ", ".join(f"{_SCHEMA_TYPES[k]} a{i}" for i, k in enumerate(fn.kinds))
        rets = "Tensor" if fn.n_outputs == 1 else "(" + ", ".join(["Tensor"] * fn.n_outputs) + ")"
        _LIBRARY.define(f"{name}({args}) -> {rets}")

        def impl(*a, _cls=fn.cls):
            out = _base_apply(_cls)(*a)
            outs = out if isinstance(out, tuple) else (out,)
            outs = tuple(o.clone() if any(o is x for x in a) else o for o in outs)  # custom ops may not alias
            return outs if fn.n_outputs > 1 else outs[0]

        _LIBRARY.impl(name, impl, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NAMESPACE}::{name}", lib=_LIBRARY)(impl)
        _DEFINED.add(name)
    return getattr(getattr(torch.ops, NAMESPACE), name).default


@contextlib.contextmanager
def opaque(functions: Sequence[CustomFunction]) -> Iterator[dict]:
    """While active, each Function's ``apply`` calls its opaque op; yields {op overload: CustomFunction}."""
    ops = {fn: _define(fn) for fn in functions}
    by_cls: dict[type, dict[tuple, Any]] = {}
    for fn, op in ops.items():
        by_cls.setdefault(fn.cls, {})[(fn.kinds, fn.n_outputs)] = op
    saved = {cls: cls.__dict__.get(_APPLY_KEY) for cls in by_cls}

    def dispatch(cls, *a):
        variants = by_cls[cls]
        kinds = tuple(_kind(v) for v in a)
        op = next((o for (k, _), o in variants.items() if k == kinds), None)
        return _base_apply(cls)(*a) if op is None else op(*a)

    try:
        for cls in by_cls:
            cls.apply = classmethod(dispatch)
        yield {op: fn for fn, op in ops.items()}
    finally:
        _restore_apply(saved)


def translation_table(functions: Sequence[CustomFunction], opset: int) -> dict:
    """``custom_translation_table`` for torch.onnx.export(dynamo=True)."""
    return {_define(fn): translation(fn, opset) for fn in functions}


# --------------------------------------------------------------------------- ONNX Runtime implementations
























