"""``path/file.py:Name`` and ``package.module:factory`` sources."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
import traceback
from pathlib import Path
from typing import Any

from torch import nn

from onnxport.core.diagnostics import Diagnostic, info
from onnxport.core.errors import ConstrainedDims, SourceError, UsageError
from onnxport.core.exits import ProcessExit
from onnxport.core.spec import Dim, InputSpec
from onnxport.sources.base import LoadedModel, load_weights, required_positional
from onnxport.sources.finish import Finishing, ensure_module, finish
from onnxport.sources.paths import python_file


def load_python(source: str, inputs: list[InputSpec], dims: list[Dim], model_args: dict[str, Any],
                weights: str | None) -> LoadedModel:
    left, attr = source.rsplit(":", 1)
    module = import_file(left) if left.endswith(".py") else _import_module(left)
    if not hasattr(module, attr):
        found = sorted(n for n, v in vars(module).items()
                       if inspect.isclass(v) and issubclass(v, nn.Module) and v.__module__ == module.__name__)
        raise SourceError(
            f"'{attr}' is not defined in {left}",
            f"nn.Module classes there: {', '.join(found)}" if found else "check the name after the ':'",
        )
    target = getattr(module, attr)
    if isinstance(target, nn.Module):
        model = target
        if model_args:
            raise UsageError(f"{attr} is a model instance; --model-args cannot apply", "drop --model-args")
    elif callable(target):
        try:
            model = target(**model_args)
        except TypeError as e:
            raise UsageError(
                f"{attr}(**model_args) failed: {e}",
                f"--model-args must match the signature {attr}{_signature(target)}",
            ) from None
        except Exception as e:  # noqa: BLE001 - user constructor errors are reported, not raised
            raise SourceError(f"{attr}(**model_args) raised {type(e).__name__}: {str(e)[:300]}",
                              f"check --model-args against {attr}{_signature(target)}") from None
    else:
        raise SourceError(f"'{attr}' in {left} is a {type(target).__name__}, not a model class or factory",
                          "name an nn.Module subclass or a function returning one")
    model = ensure_module(model, f"{left}:{attr}")
    if weights:
        load_weights(model, weights)
    built_here = inspect.isclass(target)
    if inputs:
        return finish(source, attr, "python", model, inputs, dims,
                      Finishing(defaults=spatial_defaults(model, inputs), built_here=built_here))
    from onnxport.sources.hf import made_up_inputs

    made = made_up_inputs(model)
    if made is not None:  # a transformers model: its inputs made up from its config, as for hf:DIR
        specs, ranges, defaults = made
        return finish(source, attr, "python", model, specs, dims,
                      Finishing(defaults=defaults, ranges=ranges, built_here=built_here))
    guess = guessed_inputs(model)
    if guess is None:  # finish says the model needs --input
        return finish(source, attr, "python", model, [], dims, Finishing(built_here=built_here))
    specs, defaults, note = guess
    from onnxport.sources.vision import SIZED

    try:
        return finish(source, attr, "python", model, specs, dims,
                      Finishing(defaults=defaults, diagnostics=(note,), built_here=built_here, sized=SIZED))
    except ConstrainedDims:
        raise  # the guess runs at some sizes only: loaded again at those
    except (UsageError, SourceError) as e:
        told = ", ".join(str(s) for s in specs)
        raise UsageError(f"{source} needs --input: the input guessed from its first convolution ({told}) "
                         f"does not fit it: {e.message}",
                         "describe each forward() input, e.g. -i 'x:float32[batch,3,height,width]' "
                         "-d batch=1..16") from None


def guessed_inputs(model: nn.Module) -> tuple[list[InputSpec], dict[str, Dim], Diagnostic] | None:
    """Images (or clips) for a model whose forward takes one tensor, or several each named as an image
    (``image1, image2``: optical flow, stereo), and whose first convolution is 2-D (3-D): each
    ``[batch, C, height, width]`` (``[batch, C, frames, height, width]``) with C its input channels, at a
    photo's sizes; None otherwise."""
    from onnxport.sources.vision import IMAGE_DIMS, VIDEO_DIMS, all_images

    names = required_positional(model)
    if not names or len(names) > 1 and not all_images(names):
        return None
    conv = next((m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Conv3d))), None)
    if conv is None or conv.in_channels < 1:
        return None
    clip = isinstance(conv, nn.Conv3d)
    shape = ("batch", conv.in_channels, *(("frames",) if clip else ()), "height", "width")
    specs = [InputSpec(n, "float32", shape) for n in names]
    note = info("inputs-guessed", f"no --input: {', '.join(map(str, specs))}, from forward's parameters and the "
                f"model's first convolution ({type(conv).__name__} with {conv.in_channels} input channels)",
                hint="pass --input (and --dim) to describe the inputs otherwise")
    return specs, dict(VIDEO_DIMS if clip else IMAGE_DIMS), note


# --------------------------------------------------------------------------- default sizes


def spatial_defaults(model: nn.Module, specs: list[InputSpec]) -> dict[str, Dim]:
    """Default ranges for the spatial dims of an image-like input ``[batch, C, h, w]`` of a model that says its
    own sample size: a module (the model or one inside it) with a diffusers-style ``config`` holding
    ``sample_size`` and ``in_channels`` (a UNet, a VAE), whose input with C channels is fed at that size.

    The generic default of a dim named h/w is a photo's 32..512; a diffusion model's latents are far smaller
    and its attention costs the square of h·w, so without these one forward pass at the generic sizes takes
    minutes. Each dim gets ``size/2 .. 2·size`` around the model's own size, at the multiples of the factor its
    down blocks divide by (the sizes a diffusion pipeline feeds it). Declared dims (--dim) still win."""
    layouts = _sample_layouts(model)
    out: dict[str, Dim] = {}
    for spec in specs:
        if len(spec.shape) != 4 or not isinstance(spec.shape[1], int) or spec.shape[1] not in layouts:
            continue
        sizes, factor = layouts[spec.shape[1]]
        for sym, size in zip(spec.shape[2:], sizes):
            if isinstance(sym, str) and sym not in out and size >= 2:
                out[sym] = _around(sym, size, factor)
    return out


def _sample_layouts(model: nn.Module) -> dict[int, tuple[tuple[int, int], int]]:
    """channels -> ((h, w), the factor h and w must be multiples of), from the first module per channel count
    whose config has a sample size: its ``in_channels`` at ``sample_size``, and for an autoencoder its
    ``latent_channels`` at the sample size divided by its downsampling."""
    found: dict[int, tuple[tuple[int, int], int]] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        size, channels = _field(config, "sample_size"), _field(config, "in_channels")
        if isinstance(size, int):
            size = (size, size)
        if not (isinstance(size, (tuple, list)) and len(size) == 2 and all(isinstance(n, int) for n in size)
                and isinstance(channels, int)):
            continue
        levels = _field(config, "block_out_channels")
        factor = 2 ** (len(levels) - 1) if isinstance(levels, (tuple, list)) and levels else 1
        found.setdefault(channels, ((size[0], size[1]), factor))
        latent = _field(config, "latent_channels")
        if isinstance(latent, int) and size[0] // factor >= 2 and size[1] // factor >= 2:
            found.setdefault(latent, ((size[0] // factor, size[1] // factor), 1))
    return found


def _field(config: Any, name: str) -> Any:
    if isinstance(config, dict):
        return config.get(name)
    return getattr(config, name, None)


def _around(sym: str, size: int, factor: int) -> Dim:
    """``size/2 .. 2·size`` at multiples of ``factor`` (every size when it is 1), exported at ``size``."""
    factor = max(1, min(factor, size))
    lo = max(factor, (size // 2) // factor * factor, 2)
    hi = max(2 * size // factor * factor, lo)
    if factor == 1:
        return Dim(sym, lo, hi, size)
    return Dim(sym, lo, hi, size, sizes=tuple(range(lo + (-lo) % factor, hi + 1, factor)))


def _signature(fn: Any) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"


def import_file(path_text: str, what: str = "model file"):
    """Import a Python file as a module; every failure (missing, syntax, import, exit, raise) is a one-line
    SourceError naming ``what`` it is."""
    path = python_file(path_text, what)
    name = f"onnxport_user_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SourceError(f"cannot import {path}", f"the {what} must be a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    parent = str(path.resolve().parent)
    sys.path.insert(0, parent)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(name, None)
        raise SourceError(f"syntax error in {path}, line {e.lineno}: {e.msg}", f"fix the {what}") from None
    except ImportError as e:
        sys.modules.pop(name, None)
        raise SourceError(f"{path} fails to import: {e}", "install the missing package or fix the import") from None
    except SystemExit as e:  # sys.exit(), or os._exit() where the CLI traps it (core.exits)
        sys.modules.pop(name, None)
        call = "os._exit" if isinstance(e, ProcessExit) else "exit"
        raise SourceError(f"{path} calls {call}({e.code!r}) while it is imported",
                          "put the script part of the file under `if __name__ == \"__main__\":`") from None
    except Exception as e:  # noqa: BLE001
        sys.modules.pop(name, None)
        where = traceback.extract_tb(e.__traceback__)[-1]
        raise SourceError(f"{path} raised {type(e).__name__} at line {where.lineno} while importing: {str(e)[:200]}",
                          f"the {what} must import without errors") from None
    finally:
        if sys.path and sys.path[0] == parent:
            sys.path.pop(0)
    return module


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except SyntaxError as e:
        raise SourceError(f"syntax error in {e.filename}, line {e.lineno}: {e.msg}", "fix the module") from None
    except ImportError as e:
        raise SourceError(f"cannot import module '{name}': {e}",
                          "install the package or use path/file.py:Name") from None
    except Exception as e:  # noqa: BLE001 - the module's own import-time error
        where = traceback.extract_tb(e.__traceback__)[-1]
        raise SourceError(f"module '{name}' raised {type(e).__name__} at {Path(where.filename).name}:{where.lineno} "
                          f"while importing: {str(e)[:200]}", "the module must import without errors") from None
