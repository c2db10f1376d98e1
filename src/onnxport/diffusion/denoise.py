"""The end-to-end proof of a diffusion pipeline folder: a few denoising steps with the pipeline's own scheduler
and a fixed seed, run twice — once with the PyTorch models, once with the proven ONNX files — from the same
noise and the same conditioning, then the autoencoder's image (or the final latents, when the denoiser's
latents are not the decoder's) compared within a stated tolerance. Each model was proven alone before; this
proves that their errors do not grow into a different image over the steps."""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from onnxport.core.errors import one_line
from onnxport.core.options import Options
from onnxport.core.records import Tolerance
from onnxport.core.samples import export_sizes, make_inputs
from onnxport.diffusion.component import diffusers_module, folder_of, load, read_json
from onnxport.families import Part
from onnxport.runtime.feeds import FeedMap
from onnxport.runtime.sessions import runtime_providers, session
from onnxport.runtime.variant_sessions import open_for
from onnxport.sources.base import LoadedModel

STEPS = 3
SEED = 0
BATCH = 2  # the unconditional and the conditional row, as classifier-free guidance runs them
TIMES = 10.0  # the step proof's tolerance, ten times: three steps and a decoder compound the error
BEST_COSINE = 0.999  # the chosen variants together: the centred image's cosine to PyTorch's, at least
VARIES = 10.0  # the reference's spread must be this many times the error allowed, or it cannot tell


@dataclass(frozen=True)
class DenoisingProof:
    """What the end-to-end run found: the steps, scheduler and seed, what was compared (``image`` or
    ``latents``), its largest error and cosine against PyTorch, the tolerance, and whether it passed
    (``why``: why it did not, or why it could not run)."""

    steps: int
    scheduler: str
    seed: int
    compared: str
    max_abs_err: float | None
    cosine: float | None
    tolerance: Tolerance
    passed: bool
    seconds: float
    why: str | None = None
    spread: float | None = None  # the standard deviation of PyTorch's result: what the tolerance is set against
    best: dict[str, Any] = field(default_factory=dict)  # the chosen variants run together, when any was chosen

    @property
    def summary(self) -> str:
        if self.max_abs_err is None:
            return f"end-to-end denoising not run: {self.why}"
        verdict = ("match" if self.compared == "latents" else "matches") if self.passed else "does NOT match"
        text = (f"end-to-end: {self.steps} {self.scheduler} steps from seed {self.seed}, the ONNX pipeline's "
                f"{self.compared} {verdict} PyTorch's (max abs error {self.max_abs_err:.2e}, centred cosine "
                f"{self.cosine:.6f})")
        text += f": {self.why}" if self.why else ""
        if self.best:
            chosen = ", ".join(f"{k}: {v}" for k, v in self.best["variants"].items())
            verdict = "keep" if self.best["passed"] else "do NOT keep"
            text += (f"; the chosen variants ({chosen}) together {verdict} the {self.compared} (centred cosine "
                     f"{self.best['cosine']:.4f}, at least {self.best['threshold']})")
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "scheduler": self.scheduler, "seed": self.seed, "compared": self.compared,
                "max_abs_err": self.max_abs_err, "cosine": self.cosine, "tolerance": self.tolerance.to_dict(),
                "tolerance_times": TIMES, "spread": self.spread, "passed": self.passed, "seconds": round(self.seconds, 3),
                "why": self.why, "summary": self.summary, "best": self.best or None}


def _scheduler(folder: Path) -> Any:
    """The pipeline's scheduler (a diffusers scheduler class only), set for :data:`STEPS` steps; DDIM when
    the folder has none."""
    diffusers = diffusers_module()
    config = read_json(folder / "scheduler" / "scheduler_config.json")
    cls = getattr(diffusers, str((config or {}).get("_class_name")), None)
    if not (isinstance(cls, type) and issubclass(cls, diffusers.SchedulerMixin)):
        scheduler = diffusers.DDIMScheduler()
    else:
        scheduler = cls.from_pretrained(str(folder / "scheduler"), local_files_only=True)
    try:
        scheduler.set_timesteps(STEPS)
    except (TypeError, ValueError):  # flow matching with dynamic shifting wants the image's mu
        scheduler.set_timesteps(STEPS, mu=1.0)
    return scheduler


class _Backend:
    """One model run by PyTorch (``onnx`` None) or by ONNX Runtime on its proven file."""

    def __init__(self, loaded: LoadedModel, onnx: Path | None, opener: Callable[[Path], Any] = session) -> None:
        self.loaded = loaded
        self.sess = opener(onnx) if onnx is not None else None
        self.feeds = FeedMap.of(loaded.inputs, self.sess) if self.sess is not None else None

    def __call__(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        ordered = tuple(tensors[s.name] for s in self.loaded.inputs)
        if self.sess is None:
            with torch.inference_mode():
                return self.loaded.flat(*ordered)[0].float()
        assert self.feeds is not None
        return torch.from_numpy(np.asarray(self.sess.run(None, self.feeds(ordered))[0])).float()


def _trajectory(denoiser: _Backend, decoder: _Backend | None = None, *, scheduler: Any, noise: torch.Tensor,
                conditioning: dict[str, torch.Tensor], names: tuple[str, str], scale: float) -> torch.Tensor:
    latent_name, time_name = names
    scheduler = copy.deepcopy(scheduler)  # a scheduler keeps state between steps: each run starts fresh
    x = noise * float(getattr(scheduler, "init_noise_sigma", 1.0))
    for t in scheduler.timesteps:
        scaled = scheduler.scale_model_input(x, t) if hasattr(scheduler, "scale_model_input") else x
        tensors = {**conditioning, latent_name: scaled.float(),
                   time_name: torch.full((x.shape[0],), float(t), dtype=torch.float32)}
        out = denoiser(tensors)
        if out.dim() == x.dim() and out.shape[1] == 2 * x.shape[1] and x.dim() == 4:
            out = out[:, : x.shape[1]]  # a learned variance beside the noise (PixArt): the noise only
        x = scheduler.step(out, t, x).prev_sample.float()
    if decoder is None:
        return x
    return decoder({decoder.loaded.inputs[0].name: x / scale})


def _parts_named(parts: tuple[Part, ...]) -> tuple[Part | None, Part | None]:
    main = next((p for p in parts if p.main), None)
    decoder = next((p for p in parts if p.keywords.get("part") == "vae_decoder"), None)
    return main, decoder


def prove(source: str, out: Path, parts: tuple[Part, ...], options: Options) -> DenoisingProof | None:
    """The end-to-end denoising proof of a pipeline folder (None for a source that is no pipeline: an
    autoencoder alone)."""
    main, dec_part = _parts_named(parts)
    if main is None or (folder_of(source) / "model_index.json").is_file() is False:
        return None
    t0 = time.perf_counter()
    tol = options.proof.tolerance
    opener = functools.partial(session, providers=runtime_providers(options.runtime))  # the run's device
    try:
        return _run(source, out, (main, dec_part), tol, t0, opener)
    except Exception as e:  # noqa: BLE001 - a run that breaks is a proof that did not pass, said in one line
        return DenoisingProof(STEPS, "-", SEED, "image", None, None, tol, False, time.perf_counter() - t0,
                              why=one_line(e, 200))


def _run(source: str, out: Path, named: tuple[Part, Part | None], tol: Tolerance, t0: float,
         opener: Callable[[Path], Any]) -> DenoisingProof:
    main, dec_part = named
    denoiser = load(main.source)
    specs = {s.name: s for s in denoiser.inputs}
    latent_name = next(n for n in ("sample", "hidden_states") if n in specs)
    sizes = {**export_sizes(denoiser.dims), "batch": BATCH}
    made = dict(zip(specs, make_inputs(denoiser.inputs, sizes, seed=SEED + 1)))
    noise = made.pop(latent_name)
    made.pop("timestep")
    scheduler = _scheduler(folder_of(source))
    decoder = load(dec_part.source, part="vae_decoder") if dec_part is not None else None
    vae_config = getattr(getattr(decoder.model if decoder else None, "vae", None), "config", None) or {}
    scale = float(vae_config.get("scaling_factor") or 1.0)
    fits = decoder is not None and noise.dim() == 4 and noise.shape[1] == decoder.inputs[0].shape[1]
    names = (latent_name, "timestep")
    run = functools.partial(_trajectory, scheduler=scheduler, noise=noise, conditioning=made, names=names, scale=scale)
    ref = run(_Backend(denoiser, None), _Backend(decoder, None) if fits and decoder else None)
    files = [(denoiser, out / main.name)] + ([(decoder, out / dec_part.name)] if fits and decoder and dec_part else [])
    got = run(*(_Backend(lm, folder / "model.onnx", opener) for lm, folder in files))
    r, g = ref.double().numpy(), got.double().numpy()
    compared = "image" if fits else "latents"
    why = None
    passed = bool(r.size and np.all(np.isfinite(g)) and tol.allows(g, r, times=TIMES).all())
    spread = float(np.std(r)) if r.size else 0.0
    allowed = TIMES * float(np.mean(tol.bound(r))) if r.size else 0.0
    if spread < VARIES * allowed:
        passed, why = False, (f"cannot tell: PyTorch's {compared} hardly varies (spread {spread:.1e}, under "
                              f"{VARIES:g}× the error allowed, {allowed:.1e})")
    elif not passed:
        why = f"outside {TIMES:g}× the tolerance (atol {tol.atol:g}, rtol {tol.rtol:g})"
    best = _best(run, files, r, opener) if passed else {}
    return DenoisingProof(STEPS, type(scheduler).__name__, SEED, compared, _max_err(r, g), _cosine(r, g), tol,
                          passed, time.perf_counter() - t0, why=why, spread=spread, best=best)


def _max_err(r: np.ndarray, g: np.ndarray) -> float:
    return float(np.max(np.abs(r - g))) if r.size else 0.0


def _cosine(r: np.ndarray, g: np.ndarray) -> float:
    """The cosine of the two results centred by PyTorch's mean: what varies, not the common offset."""
    rc, gc = (r - r.mean()).ravel(), (g - r.mean()).ravel()
    return float(np.dot(rc, gc) / max(np.linalg.norm(rc) * np.linalg.norm(gc), 1e-30))


def _best(run: Callable[..., torch.Tensor], files: list[tuple[LoadedModel, Path]], ref: np.ndarray,
          opener: Callable[[Path], Any]) -> dict:
    """The variants the parts chose as best (report.json's ``best``), run together as they were proven (their
    session options), judged on the same result by its centred cosine; {} when every part keeps its export."""
    chosen: dict[str, str] = {}
    backends = []
    for lm, folder in files:
        best = (read_json(folder / "report.json") or {}).get("best") or {}
        name = best.get("name") if isinstance(best, dict) else None
        if isinstance(name, str) and name != "export" and (folder / "best.onnx").is_file():
            chosen[folder.name] = name
            backends.append(_Backend(lm, folder / "best.onnx", open_for(best.get("session_options"), folder)))
        else:
            backends.append(_Backend(lm, folder / "model.onnx", opener))
    if not chosen:
        return {}
    g = run(*backends).double().numpy()
    cosine = _cosine(ref, g)
    return {"variants": chosen, "max_abs_err": _max_err(ref, g), "cosine": cosine, "threshold": BEST_COSINE,
            "passed": bool(np.all(np.isfinite(g)) and cosine >= BEST_COSINE)}
