"""Custom operators in ONNX Runtime: compiled custom-op libraries and Python implementations.

A node in a custom domain needs an implementation in ONNX Runtime, either

* a compiled custom-op library (``add_library("libmyops.so")``, CLI ``--custom-op-library``), loaded into
  every session through ``SessionOptions.register_custom_ops_library``, or
* a Python function registered with :func:`ort_python_op` (runs through onnxruntime-extensions).

Every ONNX Runtime session onnxport opens (parity, variants, bench, serve) goes through
:func:`prepare_session`, so the proof runs through the registered implementation. The registries are
process-wide: a library registered once is loaded into every later session.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from onnxport.core.errors import EnvironmentProblem, UsageError
from onnxport.core.onnxfile import walk_nodes

ORTX_DOMAIN = "ai.onnx.contrib"  # the only domain onnxruntime-extensions registers Python ops in


def split_name(name: str) -> tuple[str, str]:
    domain, _, op_type = name.rpartition("::")
    return ("" if domain in ("", "onnx", "ai.onnx") else domain), op_type


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


def reset(*, libraries: bool = True, python_ops: bool = True) -> None:
    """Forget the registered libraries and/or Python implementations."""
    if libraries:
        _LIBRARIES.clear()
    if python_ops:
        _PY_OPS.clear()


@contextlib.contextmanager
def python_ops_suspended() -> Iterator[None]:
    """Sessions opened inside see no Python implementation; the registrations come back afterwards."""
    saved = dict(_PY_OPS)
    _PY_OPS.clear()
    try:
        yield
    finally:
        _PY_OPS.clear()
        _PY_OPS.update(saved)


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
    domain, op_type = split_name(name)
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
