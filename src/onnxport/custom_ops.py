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
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import EnvironmentProblem, ExportFailed, UsageError

NAMESPACE = "onnxport_custom"
ORTX_DOMAIN = "ai.onnx.contrib"  # the only domain onnxruntime-extensions registers Python ops in
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
    """:func:`discover` on a LoadedModel at its export sizes (memoized in ``loaded.extra``)."""
    if "custom_functions" not in loaded.extra:
        from .samples import export_sizes, make_inputs

        loaded.extra["custom_functions"] = discover(
            loaded.flat, make_inputs(loaded.inputs, export_sizes(loaded.dims), seed=0)) if _symbolic_functions() else ()
    return loaded.extra["custom_functions"]


# --------------------------------------------------------------------------- the symbolic's g


def _split_name(name: str) -> tuple[str, str]:
    domain, _, op_type = name.rpartition("::")
    return ("" if domain in ("", "onnx", "ai.onnx") else domain), op_type


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
        domain, op_type = _split_name(name)
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

        domain, op_type = _split_name(name)
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


_LIBRARIES: list[Path] = []
_PY_OPS: dict[tuple[str, str], Callable] = {}  # (domain, op_type) -> python function (through onnxruntime-extensions)
_ORTX_REGISTERED: dict[str, tuple] = {}  # op_type -> (domain, inputs, outputs) as registered with onnxruntime-extensions
_ORTX_USED = False  # a session has loaded onnxruntime-extensions' ops: registering new ones then crashes at teardown


def add_library(path: str | Path) -> Path:
    """Load a compiled custom-op library into every ONNX Runtime session onnxport opens from now on."""
    import onnxruntime as ort

    path = Path(path).resolve()
    if not path.is_file():
        raise UsageError(f"custom-op library not found: {path}", "pass the path of a compiled .so/.dll/.dylib")
    if path not in _LIBRARIES:
        try:
            ort.SessionOptions().register_custom_ops_library(str(path))
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types for dlopen failures
            raise UsageError(f"onnxruntime cannot load the custom-op library {path.name}: "
                             f"{str(e).strip().splitlines()[0][:200]}",
                             "build it against this onnxruntime version's C API (RegisterCustomOps entry point)"
                             ) from None
        _LIBRARIES.append(path)
    return path


def libraries() -> tuple[Path, ...]:
    """The compiled custom-op libraries every session loads."""
    return tuple(_LIBRARIES)


def reset() -> None:
    """Forget registered libraries and Python implementations (tests)."""
    _LIBRARIES.clear()
    _PY_OPS.clear()


_ORTX_TYPES = {"float32": "dt_float", "float64": "dt_double", "float16": "dt_float16", "int64": "dt_int64",
               "int32": "dt_int32", "int8": "dt_int8", "uint8": "dt_uint8", "bool": "dt_bool", "str": "dt_string"}
_ORTX_ATTRS = {float: "dt_float", int: "dt_int64", str: "dt_string"}


def _ortx():
    try:
        import onnxruntime_extensions as ortx
    except ImportError:
        raise EnvironmentProblem("the Python package 'onnxruntime-extensions' is not installed; it runs Python "
                                 "implementations of custom ONNX operators",
                                 "pip install 'onnxport[custom-ops]' (or pip install onnxruntime-extensions), or "
                                 "pass a compiled library with --custom-op-library",
                                 code="missing-dependency") from None
    return ortx


def ort_python_op(name: str, *, inputs: Sequence[str] = ("float32",), outputs: Sequence[str] = ("float32",),
                  attrs: dict[str, type] | None = None) -> Callable[[Callable], Callable]:
    """Register a numpy implementation of the ONNX op ``name`` ("domain::OpType") for ONNX Runtime.

    ``inputs``/``outputs`` are numpy dtype names, ``attrs`` maps attribute names to float, int or str.
    The function receives numpy arrays and attributes as keywords and returns an array (or a tuple)::

        @ort_python_op("custom_domain::MyCustomOp", attrs={"alpha": float})
        def my_custom_op(x, alpha):
            return np.where(x > 0, x, alpha * x).astype(np.float32)
    """
    domain, op_type = _split_name(name)
    if not domain:
        raise UsageError(f"'{name}' names a standard ONNX op", "register ops of a custom domain: 'domain::OpType'")

    def register(func: Callable) -> Callable:
        ortx = _ortx()
        dt = ortx.PyCustomOpDef
        try:
            ins = [getattr(dt, _ORTX_TYPES[str(np.dtype(t)) if t != "str" else t]) for t in inputs]
            outs = [getattr(dt, _ORTX_TYPES[str(np.dtype(t)) if t != "str" else t]) for t in outputs]
            attr_types = {k: getattr(dt, _ORTX_ATTRS[v]) for k, v in (attrs or {}).items()}
        except (KeyError, TypeError) as e:
            raise UsageError(f"ort_python_op('{name}'): unsupported type {e}",
                             f"inputs/outputs: {', '.join(_ORTX_TYPES)}; attributes: float, int, str") from None

        other = _ORTX_REGISTERED.get(op_type)
        if other is not None and other[0] != domain:
            raise UsageError(f"ort_python_op: '{op_type}' is registered for domain '{other[0]}' already",
                             "Python implementations share one onnxruntime-extensions domain: give the ops "
                             "different names")
        if other is None and _ORTX_USED:
            raise UsageError(f"ort_python_op('{name}') registers a new op after ONNX Runtime sessions have loaded "
                             "onnxruntime-extensions' ops (its op list must not change then)",
                             "register every Python implementation at import time, e.g. in the model's file")
        _PY_OPS[(domain, op_type)] = func
        if other is None:  # onnxruntime-extensions keeps one kernel per name: re-registering replaces the body only

            def body(*arrays, **kw):
                out = _PY_OPS[(domain, op_type)](*arrays, **kw)
                if isinstance(out, tuple):
                    return tuple(np.ascontiguousarray(o) for o in out)
                return np.ascontiguousarray(out)

            ortx.onnx_op(op_type=op_type, inputs=ins, outputs=outs, attrs=attr_types)(body)
            _ORTX_REGISTERED[op_type] = (domain, tuple(inputs), tuple(outputs))
        return func

    return register


def python_ops() -> dict[tuple[str, str], Callable]:
    """The registered Python implementations, by (domain, op_type)."""
    return dict(_PY_OPS)


def model_custom_ops(model) -> list[tuple[str, str]]:
    """(domain, op_type) of every node outside the standard and Microsoft domains, subgraphs included."""
    from .check import walk_nodes

    found: dict[tuple[str, str], None] = {}
    for node in walk_nodes(model.graph):
        if node.domain not in ("", "ai.onnx", "com.microsoft", "ai.onnx.ml"):
            found[(node.domain, node.op_type)] = None
    for f in model.functions:
        for node in f.node:
            if node.domain not in ("", "ai.onnx", "com.microsoft", "ai.onnx.ml", f.domain):
                found[(node.domain, node.op_type)] = None
    return list(found)


@contextlib.contextmanager
def prepare_session(path: str | Path, opts) -> Iterator[str]:
    """Register the custom-op implementations on ``opts``; yields the file the session must load.

    Python implementations run in onnxruntime-extensions' own domain: when the model names another domain,
    the session loads a copy whose nodes are moved into that domain (the file itself stays as exported)."""
    path = Path(path)
    for lib in _LIBRARIES:
        opts.register_custom_ops_library(str(lib))
    if not _PY_OPS:
        yield str(path)
        return
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    used = model_custom_ops(model)
    if not any((d, o) in _PY_OPS for d, o in used):
        yield str(path)
        return
    global _ORTX_USED
    _ORTX_USED = True
    ortx_lib = Path(_ortx().get_library_path()).resolve()
    if ortx_lib not in _LIBRARIES:  # loading the same library twice makes onnxruntime refuse its kernels
        opts.register_custom_ops_library(str(ortx_lib))
    moved = {(d, o) for d, o in used if (d, o) in _PY_OPS and d != ORTX_DOMAIN}
    if not moved:
        yield str(path)
        return
    _move_domain(model, moved)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".ortx.onnx", dir=path.parent)
    os.close(fd)
    try:
        onnx.save_model(model, tmp)
        yield tmp
    finally:
        Path(tmp).unlink(missing_ok=True)


def _move_domain(model, moved: set[tuple[str, str]]) -> None:
    import onnx

    from .check import walk_nodes

    for node in walk_nodes(model.graph):
        if (node.domain, node.op_type) in moved:
            node.domain = ORTX_DOMAIN
    if not any(o.domain == ORTX_DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(ORTX_DOMAIN, 1))


def import_implementations(path: str | Path) -> None:
    """Import a Python file whose :func:`ort_python_op` registrations ONNX Runtime should use (e.g. the model's
    own file, for ``serve``)."""
    import importlib.util
    import sys

    path = Path(path).resolve()
    if not path.is_file():
        raise UsageError(f"Python file not found: {path}", "pass the file that registers the implementations")
    name = f"onnxport_custom_impl_{abs(hash(str(path)))}"
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except Exception as e:  # noqa: BLE001 - the user's file
        del sys.modules[name]
        raise UsageError(f"importing {path.name} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}",
                         "fix the file; it should only define and register the implementations") from None
