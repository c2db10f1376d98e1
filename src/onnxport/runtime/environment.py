"""What this machine offers: package versions (the onnxruntime really imported), platform, CPU features; recorded
in every report and read by the plans that depend on the CPU. ``onnxport doctor`` adds the providers, GPU libraries
and opsets (:mod:`onnxport.diagnose.machine`)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from collections.abc import Sequence
from pathlib import Path

from onnxport.core.errors import UsageError

PACKAGES = ("torch", "torchvision", "onnx", "onnxruntime", "onnxscript", "onnx-ir", "transformers", "timm",
            "onnxslim", "numpy")
_CPU_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile",
              "amx_int8", "amx_bf16", "avx512_fp16", "amx_fp16", "f16c", "asimdhp", "asimddp", "bf16", "i8mm")


ORT_DISTRIBUTIONS = ("onnxruntime-gpu", "onnxruntime", "onnxruntime-directml", "onnxruntime-openvino")


def versions() -> dict[str, str | None]:
    """Installed versions; ``onnxruntime`` is the version of the module really imported (the CPU wheel's
    metadata can sit beside onnxruntime-gpu's), and ``onnxruntime_package`` names its distribution."""
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    out.update(onnxruntime_package())
    return out


def onnxruntime_package() -> dict[str, str | None]:
    """The onnxruntime module imported: its version and the distribution it belongs to (the one whose
    version matches, preferring a GPU build when several are installed)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return {"onnxruntime": None, "onnxruntime_package": None}
    version = getattr(ort, "__version__", None)
    dists = _ort_owners()
    matching = []
    for dist in dists:
        try:
            if importlib.metadata.version(dist) == version:
                matching.append(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    package = (matching or dists or [None])[0]
    return {"onnxruntime": version, "onnxruntime_package": package}


def _ort_owners() -> list[str]:
    """The distributions that install the ``onnxruntime`` module: the known ones (:data:`ORT_DISTRIBUTIONS`,
    in order) looked up by name, a few small files read; only when none of them is installed, every installed
    distribution (``packages_distributions``, which reads all their file lists: a second on a large
    environment, on every run)."""
    known = []
    for name in ORT_DISTRIBUTIONS:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        top = (dist.read_text("top_level.txt") or "").split() or {f.parts[0] for f in dist.files or () if f.parts}
        if "onnxruntime" in top:
            known.append(name)
    return known or list(importlib.metadata.packages_distributions().get("onnxruntime", []))


INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")  # int8 dot-product instructions


def int8_dot(cpu_flags: Sequence[str]) -> str | None:
    """The CPU's int8 dot-product feature (VNNI, AMX-INT8, Arm dot products) among ``cpu_flags``, None where it has
    none (int8 matmuls then sum pairs in int16: AVX2's vpmaddubsw)."""
    return next((f for f in INT8_DOT_FLAGS if f in cpu_flags), None)


CPU_FLAGS_ENV = "ONNXPORT_CPU_FLAGS"  # "avx2,fma": plan as if the CPU had only these features (see cpu())


def cpu() -> dict:
    """The CPU's model, core count and the features onnxport plans by (``flags``, from /proc/cpuinfo). Where
    $ONNXPORT_CPU_FLAGS is set (a comma-separated list, e.g. ``avx2,fma``) the plan is made as if the CPU had
    only those (``flags_detected`` keeps what it has): to see what another CPU would be given, not to speed
    anything up."""
    model, flags = platform.processor() or platform.machine(), set()
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("model name") and ":" in line:
                model = line.split(":", 1)[1].strip()
            elif (line.startswith("flags") or line.startswith("Features")) and ":" in line:
                flags = set(line.split(":", 1)[1].split())
    detected = [f for f in _CPU_FLAGS if f in flags]
    given = forced_cpu_flags()
    if given is None:
        return {"model": model, "cores": os.cpu_count(), "flags": detected}
    return {"model": model, "cores": os.cpu_count(), "flags": given, "flags_detected": detected,
            "flags_from": CPU_FLAGS_ENV}


def flags_from() -> str:
    """Where the CPU features a plan's messages name come from: ``/proc/cpuinfo``, or $ONNXPORT_CPU_FLAGS with its
    value where it is set (then the plan is made for the CPU it describes, not this one)."""
    forced = os.environ.get(CPU_FLAGS_ENV)
    return "/proc/cpuinfo" if forced is None else f"{CPU_FLAGS_ENV}={forced[:60]!r}"


def this_cpu() -> str:
    """'this CPU', or 'the CPU $ONNXPORT_CPU_FLAGS describes' (with its value) where it is set."""
    return "this CPU" if os.environ.get(CPU_FLAGS_ENV) is None else f"the CPU {flags_from()} describes"


def forced_cpu_flags() -> list[str] | None:
    """The features $ONNXPORT_CPU_FLAGS plans by (None: unset); a UsageError naming the variable where it is
    empty or names something that is no feature onnxport plans by."""
    forced = os.environ.get(CPU_FLAGS_ENV)
    if forced is None:
        return None
    given = [f.strip().lower() for f in forced.replace(" ", ",").split(",") if f.strip()]
    unknown = [f for f in given if f not in _CPU_FLAGS]
    if not given or unknown:
        said = "names no CPU feature" if not given else f"names {unknown[0][:30]!r}, no CPU feature onnxport plans by"
        raise UsageError(f"{CPU_FLAGS_ENV}={forced[:60]!r} {said}",
                         f"list features from {', '.join(_CPU_FLAGS)} (comma-separated), or unset it")
    return given


def summary() -> dict:
    """Versions, platform and CPU: recorded in every report."""
    return {"python": platform.python_version(), "platform": platform.platform(), "packages": versions(),
            "cpu": cpu()}
