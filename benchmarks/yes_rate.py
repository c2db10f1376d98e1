"""Yes rate on models we did not write: does `onnxport export` prove them, and could plain torch.onnx.export?

For each model (a small factory building an nn.Module with random weights, its inputs and dynamic dims):

  (a) `onnxport export SOURCE ... --json` through the CLI (exit code, status, exporter kept, seconds, first error);
  (b) plain `torch.onnx.export(..., dynamo=False, dynamic_axes=...)`;
  (c) plain `torch.onnx.export(..., dynamo=True, dynamic_shapes=...)`;

and every file written ((a) when proven, (b), (c)) is checked independently with ONNX Runtime against PyTorch at
3 sizes inside the declared ranges (smallest, an odd size in between, largest): same shapes, and
|onnx - torch| <= 1e-3 + 1e-3 * |torch| everywhere. A proven onnxport file that fails this check is a silent failure.
Weights are random and seeded (torch.manual_seed(0) before building, as onnxport does), so the model checked
here is the one onnxport exported. Nothing is downloaded.

    .venv/bin/python benchmarks/yes_rate.py                       # every model; writes benchmarks/results/yes_rate.json
    .venv/bin/python benchmarks/yes_rate.py --only bert --only swin_t --timeout 300
    .venv/bin/python benchmarks/yes_rate.py --list

Each export runs in its own process (one at a time), so a crash or a hang costs one row, not the run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "yes_rate.json"
ATOL = RTOL = 1e-3


# ----------------------------------------------------------------------------------------------------------------
# the models


@dataclass
class Case:
    name: str
    build: Callable[[], Any]               # the nn.Module (random weights), as onnxport gets it from a file source
    inputs: list[tuple]                    # (name, dtype, shape with ints or dim symbols[, (lo, hi) integer values])
    dims: dict[str, tuple[int, int, int]]  # symbol -> (min, max, example size for the plain exporters)
    source: str | None = None              # 'torchvision:NAME' / 'timm:NAME'; None: a temp file exposing build()
    plain_build: Callable[[], Any] | None = None  # what plain export gets, when it differs (detectors)
    multiple: int = 1                      # check sizes are multiples of this
    note: str = ""
    cli_inputs: bool = True                # pass -i (file sources); torchvision/timm sources describe their own

    def module(self, plain: bool = False):
        import torch
        torch.manual_seed(0)
        m = (self.plain_build if plain and self.plain_build else self.build)()
        return m.eval()


def _tv(name: str, **kw):
    def build():
        import torchvision
        builder = torchvision.models.get_model_builder(name)
        import inspect
        kwargs = {"weights": None, **kw}
        if "weights_backbone" in inspect.signature(builder).parameters:
            kwargs["weights_backbone"] = None
        return builder(**kwargs)
    return build


def _timm(name: str, **kw):
    def build():
        import timm
        return timm.create_model(name, pretrained=False, **kw)
    return build


def _detector(name: str):
    """What a user hands plain export for a torchvision detector: one image [1,3,H,W] in, that image's detections out."""
    def build():
        import torch

        class OneImage(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = _tv(name)()

            def forward(self, image):
                d = self.m(list(image))[0]
                return d["boxes"], d["labels"], d["scores"]
        return OneImage()
    return build


def _hf(kind: str, config_name: str, tuple_outputs: bool = True, **cfg):
    def build():
        import transformers
        config = getattr(transformers, config_name)(**cfg)
        config.return_dict = not tuple_outputs  # causal LMs of this transformers need their output records
        return getattr(transformers, kind)(config)
    return build


def _whisper_encoder():
    import transformers
    cfg = transformers.WhisperConfig(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                                     decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                     num_mel_bins=80, max_source_positions=1500)
    cfg.return_dict = False
    return transformers.WhisperModel(cfg).get_encoder()


def _speech(kind: str):
    def build():
        import transformers
        cfg = getattr(transformers, kind.replace("Model", "Config"))(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            conv_dim=(32,) * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, vocab_size=32)
        if kind == "Wav2Vec2Model":  # HubertModel's forward breaks on return_dict=False (it calls .to_tuple())
            cfg.return_dict = False
        return getattr(transformers, kind)(cfg)
    return build


def _vae_decoder():
    import torch
    from diffusers import AutoencoderKL

    class Decode(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(32, 64),
                                     down_block_types=("DownEncoderBlock2D",) * 2,
                                     up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1,
                                     norm_num_groups=32, sample_size=64)

        def forward(self, z):
            return self.vae.decode(z).sample
    return Decode()


def _unet():
    import torch
    from diffusers import UNet2DConditionModel

    class Denoise(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.unet = UNet2DConditionModel(
                sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32, attention_head_dim=8,
                norm_num_groups=32)

        def forward(self, sample, timestep, encoder_hidden_states):
            return self.unet(sample, timestep, encoder_hidden_states).sample
    return Denoise()


# code patterns that stand for user code -------------------------------------------------------------------------

def _pattern(which: str):
    def build():
        import torch
        import torch.nn.functional as F
        from torch import nn

        class ListCompOverDim(nn.Module):
            def __init__(self):
                super().__init__()
                self.f = nn.Linear(8, 8)

            def forward(self, x):
                return torch.stack([torch.tanh(self.f(x[:, i])) for i in range(x.shape[1])], 1)

        class GridSampleAffine(nn.Module):
            def __init__(self):
                super().__init__()
                self.loc = nn.Linear(3, 6)

            def forward(self, x):
                theta = self.loc(x.mean((2, 3))).view(-1, 2, 3) * 0.1 + torch.tensor([[1., 0, 0], [0, 1., 0]])
                grid = F.affine_grid(theta, list(x.size()), align_corners=False)
                return F.grid_sample(x, grid, align_corners=False)

        class TopkTies(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(16, 16)

            def forward(self, x):
                v = torch.round(self.proj(x) * 2) / 2
                vals, idx = torch.topk(v, k=4, dim=-1)
                return vals, idx

        class ScatterAddByIndex(nn.Module):
            def __init__(self):
                super().__init__()
                self.f = nn.Linear(8, 8)

            def forward(self, x, idx):
                h = self.f(x)
                out = torch.zeros(x.shape[0], 10, 8, dtype=h.dtype)
                out.scatter_add_(1, idx.unsqueeze(-1).expand(-1, -1, 8), h)
                return out

        class WhileOnTensorValue(nn.Module):
            def __init__(self):
                super().__init__()
                self.f = nn.Linear(4, 4)

            def forward(self, x):
                while x.norm() > 1:
                    x = x / 2
                return self.f(x)

        return {"ListCompOverDim": ListCompOverDim, "GridSampleAffine": GridSampleAffine, "TopkTies": TopkTies,
                "ScatterAddByIndex": ScatterAddByIndex, "WhileOnTensorValue": WhileOnTensorValue}[which]()
    return build


IMG = {"batch": (1, 4, 2), "height": (64, 256, 192), "width": (64, 256, 160)}
TOK = [("input_ids", "int64", ("batch", "seq"), (0, 99))]
TOK_DIMS = {"batch": (1, 8, 2), "seq": (1, 128, 16)}


def _img_in(h="height", w="width", b="batch"):
    return [("image", "float32", (b, 3, h, w))]


def _installed(package: str) -> bool:
    try:
        import importlib.util
        return importlib.util.find_spec(package) is not None
    except Exception:
        return False


def _diffusers() -> bool:
    return _installed("diffusers")


def _yolo():
    """A YOLOv8n DetectionModel from its yaml (random weights): eval forward returns (predictions, raw dict)."""
    import os

    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics.nn.tasks import DetectionModel

    return DetectionModel("yolov8n.yaml", nc=80, verbose=False)


def cases() -> list[Case]:
    det = {"height": (160, 320, 240), "width": (160, 320, 256)}
    out = [
        Case("fasterrcnn_mobilenet_v3_large_320_fpn", _tv("fasterrcnn_mobilenet_v3_large_320_fpn"),
             [("image", "float32", (1, 3, "height", "width"))], det,
             source="torchvision:fasterrcnn_mobilenet_v3_large_320_fpn",
             plain_build=_detector("fasterrcnn_mobilenet_v3_large_320_fpn"), cli_inputs=False),
        Case("ssdlite320_mobilenet_v3_large", _tv("ssdlite320_mobilenet_v3_large"),
             [("image", "float32", (1, 3, "height", "width"))], det,
             source="torchvision:ssdlite320_mobilenet_v3_large",
             plain_build=_detector("ssdlite320_mobilenet_v3_large"), cli_inputs=False),
        Case("deeplabv3_mobilenet_v3_large", _tv("deeplabv3_mobilenet_v3_large"), _img_in(),
             {"batch": (1, 2, 2), "height": (64, 256, 192), "width": (64, 256, 160)},
             source="torchvision:deeplabv3_mobilenet_v3_large", cli_inputs=False),
        Case("raft_small", _tv("raft_small"),
             [("image1", "float32", ("batch", 3, "height", "width")),
              ("image2", "float32", ("batch", 3, "height", "width"))],
             {"batch": (1, 2, 2), "height": (128, 192, 136), "width": (128, 192, 152)}, multiple=8,
             note="sizes multiple of 8, at least 128 (the correlation pyramid)"),
        Case("swin_t", _tv("swin_t"), _img_in(), {"batch": (1, 2, 2), "height": (64, 256, 224), "width": (64, 256, 224)},
             source="torchvision:swin_t", cli_inputs=False),
        Case("regnet_y_400mf", _tv("regnet_y_400mf"), _img_in(), IMG, source="torchvision:regnet_y_400mf",
             cli_inputs=False),
        Case("timm_vit_tiny_dynamic", _timm("vit_tiny_patch16_224", dynamic_img_size=True), _img_in(),
             {"batch": (1, 4, 2), "height": (64, 256, 224), "width": (64, 256, 160)}, multiple=16,
             note="vit_tiny_patch16_224(dynamic_img_size=True); sizes multiple of 16"),
        Case("timm_convnext_atto", _timm("convnext_atto"), _img_in(), IMG, source="timm:convnext_atto",
             cli_inputs=False),
        Case("timm_efficientnet_b0", _timm("efficientnet_b0"), _img_in(), IMG, source="timm:efficientnet_b0",
             cli_inputs=False),
        Case("hf_wav2vec2", _speech("Wav2Vec2Model"), [("input_values", "float32", ("batch", "time"))],
             {"batch": (1, 2, 2), "time": (1600, 16000, 8000)}),
        Case("hf_hubert", _speech("HubertModel"), [("input_values", "float32", ("batch", "time"))],
             {"batch": (1, 2, 2), "time": (1600, 16000, 8000)}),
        Case("hf_whisper_encoder", _whisper_encoder, [("input_features", "float32", ("batch", 80, 3000))],
             {"batch": (1, 2, 2)}),
        Case("hf_bert", _hf("BertModel", "BertConfig", vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=128), TOK, TOK_DIMS),
        Case("hf_distilbert", _hf("DistilBertModel", "DistilBertConfig", vocab_size=100, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                  max_position_embeddings=128), TOK, TOK_DIMS),
        Case("hf_t5_encoder", _hf("T5EncoderModel", "T5Config", vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=2,
                                  num_heads=2), TOK, TOK_DIMS),
        Case("hf_vit", _hf("ViTModel", "ViTConfig", image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=64),
             [("pixel_values", "float32", ("batch", 3, 32, 32))], {"batch": (1, 8, 2)}),
        Case("hf_clip_vision", _hf("CLIPVisionModel", "CLIPVisionConfig", image_size=32, patch_size=8, hidden_size=32,
                                   num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
             [("pixel_values", "float32", ("batch", 3, 32, 32))], {"batch": (1, 8, 2)}),
        Case("hf_llama_forward", _hf("LlamaForCausalLM", "LlamaConfig", vocab_size=100, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                     max_position_embeddings=128, use_cache=False, tuple_outputs=False), TOK, TOK_DIMS,
             note="plain forward, no cache"),
    ]
    if _diffusers():
        out += [
            Case("diffusers_vae_decode", _vae_decoder, [("z", "float32", ("batch", 4, "height", "width"))],
                 {"batch": (1, 2, 2), "height": (8, 32, 16), "width": (8, 32, 24)}),
            Case("diffusers_unet2d_cond", _unet,
                 [("sample", "float32", ("batch", 4, "height", "width")),
                  ("timestep", "int64", ("batch",), (0, 999)),
                  ("encoder_hidden_states", "float32", ("batch", "seq", 32))],
                 {"batch": (1, 2, 2), "height": (8, 32, 16), "width": (8, 32, 24), "seq": (1, 77, 12)}, multiple=2,
                 note="sizes multiple of 2"),
        ]
    if _installed("ultralytics"):  # not in the dev extra (AGPL, opencv): measured where installed
        out.append(Case("ultralytics_yolov8n", _yolo, [("images", "float32", ("batch", 3, "height", "width"))],
                        {"batch": (1, 8, 2), "height": (64, 640, 256), "width": (64, 640, 320)}, multiple=32,
                        note="DetectionModel('yolov8n.yaml'); outputs: predictions and the head's raw boxes/scores"))
    out += [
        Case("pattern_listcomp_over_dim", _pattern("ListCompOverDim"), [("x", "float32", ("batch", "seq", 8))],
             {"batch": (1, 8, 2), "seq": (1, 32, 5)}),
        Case("pattern_grid_sample_affine", _pattern("GridSampleAffine"), [("x", "float32", ("batch", 3, "h", "w"))],
             {"batch": (1, 4, 2), "h": (16, 64, 24), "w": (16, 64, 32)}),
        Case("pattern_topk_ties", _pattern("TopkTies"), [("x", "float32", ("batch", 16))], {"batch": (1, 16, 3)}),
        Case("pattern_scatter_add", _pattern("ScatterAddByIndex"),
             [("x", "float32", ("batch", "n", 8)), ("idx", "int64", ("batch", "n"), (0, 9))],
             {"batch": (1, 8, 2), "n": (1, 64, 7)}),
        Case("pattern_while_tensor_value", _pattern("WhileOnTensorValue"), [("x", "float32", ("batch", 4))],
             {"batch": (1, 64, 3)}),
        Case("fcos_resnet50_fpn", _tv("fcos_resnet50_fpn"), [("image", "float32", (1, 3, "height", "width"))], det,
             source="torchvision:fcos_resnet50_fpn", plain_build=_detector("fcos_resnet50_fpn"), cli_inputs=False,
             note="resizes to 800 px inside: slow"),
    ]
    return out


def case_by_name(name: str) -> Case:
    for c in cases():
        if c.name == name:
            return c
    raise KeyError(name)


# ----------------------------------------------------------------------------------------------------------------
# inputs and the independent check


def _size(lo: int, hi: int, frac: float, multiple: int, odd: bool) -> int:
    v = lo + (hi - lo) * frac
    if multiple > 1:
        v = max(lo, min(hi, int(round(v / multiple)) * multiple))
        if v % multiple:
            v = ((lo + multiple - 1) // multiple) * multiple
        return int(v)
    v = int(round(v))
    if odd and v % 2 == 0 and v + 1 <= hi:
        v += 1
    return v


def check_sizes(case: Case) -> list[dict[str, int]]:
    """3 size assignments inside the declared ranges: all smallest, odd sizes in between, all largest."""
    out = []
    for frac, odd in ((0.0, False), (0.37, True), (1.0, False)):
        out.append({d: _size(lo, hi, frac, case.multiple, odd) for d, (lo, hi, _) in case.dims.items()})
    return out


def make_inputs(case: Case, sizes: dict[str, int], seed: int):
    import torch
    g = torch.Generator().manual_seed(seed)
    tensors = []
    for spec in case.inputs:
        name, dtype, shape = spec[:3]
        shp = [s if isinstance(s, int) else sizes[s] for s in shape]
        if dtype.startswith("int"):
            lo, hi = spec[3] if len(spec) > 3 else (0, 9)
            tensors.append(torch.randint(lo, hi + 1, shp, generator=g, dtype=getattr(torch, dtype)))
        else:
            tensors.append(torch.randn(shp, generator=g, dtype=getattr(torch, dtype)))
    return tensors


def _leaves(out) -> list[tuple[str, Any]]:
    import torch
    from torch.utils._pytree import keystr, tree_flatten_with_path
    flat, _ = tree_flatten_with_path(out)
    return [(keystr(p), v) for p, v in flat if isinstance(v, torch.Tensor)]


def _unordered_detections(ref: list, got: list) -> str | None:
    """Detections (outputs sharing their first axis N: boxes [N,4], labels [N], scores [N]) compared as a set:
    every PyTorch row has an unused ONNX row equal within the tolerance. None when they agree, else why."""
    import numpy as np

    def rows(outs):
        n = outs[0].shape[0] if outs and outs[0].ndim else 0
        if any(o.ndim == 0 or o.shape[0] != n for o in outs):
            return None
        return np.concatenate([o.reshape(n, int(np.prod(o.shape[1:]))).astype(np.float64) for o in outs], axis=1)

    r, g = rows(ref), rows(got)
    if r is None or g is None or r.shape != g.shape:
        return f"detections: {None if g is None else g.shape} vs PyTorch {None if r is None else r.shape}"
    used = np.zeros(len(g), bool)
    missing = 0
    for row in r:
        close = (np.abs(g - row) <= ATOL + RTOL * np.abs(row)).all(1) & ~used
        if close.any():
            used[np.flatnonzero(close)[0]] = True
        else:
            missing += 1
    return None if missing == 0 else f"{missing} of {len(r)} detections without an equal counterpart"


def independent_check(case: Case, onnx_path: str, plain_module: bool) -> dict:
    """Run the file with ONNX Runtime against PyTorch at the 3 check sizes."""
    import numpy as np
    import onnxruntime as ort
    import torch
    model = case.module(plain=plain_module)
    try:
        sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "error": f"onnxruntime cannot load: {str(e).splitlines()[0][:300]}", "sizes": []}
    in_names = [i.name for i in sess.get_inputs()]
    out_names = [o.name for o in sess.get_outputs()]
    rows, ok = [], True
    for k, sizes in enumerate(check_sizes(case)):
        args = make_inputs(case, sizes, seed=100 + k)
        try:
            with torch.no_grad():
                ref = _leaves(model(*[a.clone() for a in args]))
        except Exception as e:  # noqa: BLE001
            rows.append({"sizes": sizes, "skipped": f"PyTorch fails here: {type(e).__name__}: {str(e)[:200]}"})
            continue
        if len(in_names) != len(args):
            rows.append({"sizes": sizes, "ok": False, "error": f"file has {len(in_names)} inputs, model takes {len(args)}"})
            ok = False
            continue
        try:
            got = sess.run(None, {n: a.numpy() for n, a in zip(in_names, args)})
        except Exception as e:  # noqa: BLE001
            rows.append({"sizes": sizes, "ok": False, "error": f"onnxruntime: {str(e).splitlines()[0][:300]}"})
            ok = False
            continue
        if len(got) != len(ref):
            rows.append({"sizes": sizes, "ok": False, "error": f"{len(got)} outputs, PyTorch gives {len(ref)}"})
            ok = False
            continue
        # match outputs by name where the file names them after the PyTorch outputs, else by position
        names = [p.strip("[]'\". ") for p, _ in ref]
        order = list(range(len(ref)))
        if sorted(names) == sorted(out_names) and len(set(names)) == len(names):
            order = [out_names.index(n) for n in names]
        worst, err = 0.0, None
        if case.plain_build is not None:  # a detector: its detections in any order (ties reorder them)
            floats = [r.detach().numpy() for _, r in ref if r.ndim == 1 and r.is_floating_point()]
            if floats and len(np.unique(floats[-1])) == 1 and len(floats[-1]) > 1:
                rows.append({"sizes": sizes, "skipped": "every score is tied (random weights): which detections "
                                                        "survive the top-k cut is decided by sort order"})
                continue
            err = _unordered_detections([r.detach().numpy() for _, r in ref], [np.asarray(got[j]) for j in order])
            rows.append({"sizes": sizes, "ok": err is None, "compare": "detections, any order",
                         **({"error": err} if err else {})})
            ok = ok and err is None
            continue
        for (path, r), j in zip(ref, order):
            r = r.detach().numpy()
            o = np.asarray(got[j])
            if r.shape != o.shape:
                err = f"output {path or j}: shape {list(o.shape)} vs PyTorch {list(r.shape)}"
                break
            if r.size == 0:
                continue
            if r.dtype.kind in "iub":
                if not np.array_equal(r, o):
                    err = f"output {path or j}: {int((r != o).sum())} of {r.size} values differ"
                    # indices (topk/sort) that differ only where a float output of the same shape agrees: a tie
                    if any(v.shape == r.shape and v.is_floating_point() for _, v in ref):
                        err += " (a float output of the same shape matches: indices of tied values)"
                    break
                continue
            d = np.abs(o.astype(np.float64) - r.astype(np.float64))
            bad = ~(d <= ATOL + RTOL * np.abs(r))
            worst = max(worst, float(np.nanmax(d)) if d.size else 0.0)
            if bad.any():
                err = f"output {path or j}: max abs error {float(np.nanmax(d)):.3g}"
                break
        rows.append({"sizes": sizes, "ok": err is None, "max_abs_err": worst, **({"error": err} if err else {})})
        ok = ok and err is None
    checked = [r for r in rows if "skipped" not in r]
    if not checked:  # nothing decided: PyTorch failed at every size, or every score was tied
        tied = next((r["skipped"] for r in rows if "tied" in r.get("skipped", "")), None)
        return {"ok": None if tied else False, "sizes": rows, "error": tied}
    first = next((r.get("error") for r in rows if r.get("ok") is False), None)
    return {"ok": ok, "sizes": rows, "error": first if not ok else None}


# ----------------------------------------------------------------------------------------------------------------
# the three exports


def plain_export(case: Case, dynamo: bool, path: str) -> dict:
    """Plain torch.onnx.export as a user writes it, then the independent check. Runs in a child process."""
    import warnings

    import torch
    warnings.filterwarnings("ignore")
    model = case.module(plain=True)
    example = {d: ex for d, (_, _, ex) in case.dims.items()}
    args = tuple(make_inputs(case, example, seed=7))
    names = [s[0] for s in case.inputs]
    t0 = time.perf_counter()
    try:
        if dynamo:
            dims = {d: torch.export.Dim(d, min=lo, max=hi) for d, (lo, hi, _) in case.dims.items()}
            shapes = tuple({ax: dims[s] for ax, s in enumerate(spec[2]) if not isinstance(s, int)} or None
                           for spec in case.inputs)
            torch.onnx.export(model, args, path, dynamo=True, dynamic_shapes=shapes, input_names=names,
                              verbose=False)
        else:
            axes = {spec[0]: {ax: s for ax, s in enumerate(spec[2]) if not isinstance(s, int)}
                    for spec in case.inputs}
            torch.onnx.export(model, args, path, dynamo=False, input_names=names,
                              dynamic_axes={k: v for k, v in axes.items() if v})
    except Exception as e:  # noqa: BLE001
        return {"exported": False, "seconds": round(time.perf_counter() - t0, 1), "error": _reason(e)}
    secs = round(time.perf_counter() - t0, 1)
    if not os.path.exists(path):
        return {"exported": False, "seconds": secs, "error": "no file written"}
    chk = independent_check(case, path, plain_module=True)
    return {"exported": True, "seconds": secs, "correct": chk["ok"], "error": chk["error"], "check": chk["sizes"]}


def _reason(e: BaseException) -> str:
    """The innermost cause's type and first line (torch.onnx wraps the real reason in a generic step message)."""
    import re
    while e.__cause__ is not None:
        e = e.__cause__
    lines = [ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", str(e)).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {(lines[0] if lines else '')[:300]}"


def _child(name: str, what: str, path: str) -> None:
    case = case_by_name(name)
    if what == "check":
        res = independent_check(case, path, plain_module=False)
    else:
        res = plain_export(case, dynamo=(what == "dynamo"), path=path)
    print("@@RESULT@@" + json.dumps(res))


def run_child(name: str, what: str, path: str, timeout: float) -> dict:
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, __file__, "--_child", name, what, path], capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"exported": False, "ok": False, "seconds": round(time.perf_counter() - t0, 1),
                "error": f"timed out after {timeout:.0f} s"}
    for line in p.stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            return json.loads(line[len("@@RESULT@@"):])
    tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"exported": False, "ok": False, "seconds": round(time.perf_counter() - t0, 1),
            "error": f"process died (exit {p.returncode}): {tail[:300]}"}


def _cli_source(case: Case, tmp: Path) -> str:
    if case.source:
        return case.source
    f = tmp / f"{case.name}_model.py"
    f.write_text(textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {str(HERE)!r})
        import yes_rate


        def build():
            return yes_rate.case_by_name({case.name!r}).build()
        """))
    return f"{f}:build"


def onnxport_export(case: Case, tmp: Path, timeout: float) -> dict:
    out = tmp / "onnxport-out"
    cmd = [sys.executable, "-m", "onnxport", "export", _cli_source(case, tmp), "-o", str(out), "--json"]
    if case.cli_inputs:
        for spec in case.inputs:
            name, dtype, shape = spec[:3]
            rng = f"{{{spec[3][0]}..{spec[3][1]}}}" if len(spec) > 3 else ""
            cmd += ["-i", f"{name}:{dtype}[{','.join(str(s) for s in shape)}]{rng}"]
    for d, (lo, hi, _) in case.dims.items():
        cmd += ["-d", f"{d}={lo}..{hi}"]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"exit": None, "status": "timeout", "seconds": round(time.perf_counter() - t0, 1),
                "error": {"code": "timeout", "message": f"no answer within {timeout:.0f} s"}, "command": cmd[3:]}
    secs = round(time.perf_counter() - t0, 1)
    res: dict[str, Any] = {"exit": p.returncode, "seconds": secs, "command": cmd[3:], "status": None,
                           "exporter": None, "error": None}
    rep = None
    with contextlib.suppress(ValueError):
        rep = json.loads(p.stdout)
    if isinstance(rep, dict):
        res["status"] = rep.get("status")
        res["exporter"] = (rep.get("export") or {}).get("exporter")
        res["summary"] = rep.get("summary")
        first = next((d for d in rep.get("diagnostics") or [] if d.get("severity") == "error"), None)
        if first:
            res["error"] = {"code": first.get("code"), "message": first.get("message")}
        res["attempts"] = [{k: a.get(k) for k in ("exporter", "ok", "seconds", "error", "unproven")}
                           for a in (rep.get("export") or {}).get("attempts") or []]
    if res["error"] is None and p.returncode != 0:
        lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
        line = next((ln for ln in lines if ln.startswith("error")), lines[-1] if lines else "")
        res["error"] = {"code": f"exit-{p.returncode}", "message": line[:400]}
    model = out / "model.onnx"
    if p.returncode == 0 and model.exists():
        res["check"] = run_child(case.name, "check", str(model), timeout=600)
    return res


# ----------------------------------------------------------------------------------------------------------------
# the table


def _ox(r: dict) -> str:
    if r.get("exit") == 0:
        ok = r.get("check", {}).get("ok")
        return "proven" + ("" if ok else " (check undecidable: ties)" if ok is None else " (CHECK FAILS)")
    if r.get("exit") is None:
        return "timeout"
    label = {1: "not proven", 2: "refused", 3: "export failed", 4: "environment", 70: "internal error"}
    code = (r.get("error") or {}).get("code") or ""
    code = "" if code.startswith("exit-") else f": {code}"
    return f"exit {r['exit']} {label.get(r['exit'], '')}{code}"


def _plain(r: dict) -> str:
    if not r.get("exported"):
        return "fails" if "timed out" not in str(r.get("error")) else "timeout"
    return "correct" if r.get("correct") else "undecidable" if r.get("correct") is None else "WRONG"


def summarize(rows: list[dict]) -> dict:
    m = len(rows)
    yes = sum(r["onnxport"].get("exit") == 0 for r in rows)
    any_plain = sum(bool(r["legacy"].get("correct") or r["dynamo"].get("correct")) for r in rows)
    silent = sum(r["onnxport"].get("exit") == 0 and r["onnxport"].get("check", {}).get("ok") is False for r in rows)
    # said, not proven: PyTorch's own outputs could not tell a right file from a wrong one (random weights)
    said = sum((r["onnxport"].get("error") or {}).get("code") == "cannot-tell" for r in rows)
    return {"models": m, "onnxport_yes": yes, "any_plain_correct": any_plain, "silent_failures": silent,
            "cannot_tell": said}


def print_table(rows: list[dict]) -> None:
    hdr = ("model", "onnxport", "legacy plain", "dynamo plain", "seconds (onnxport / legacy / dynamo)")
    body = [(r["model"], _ox(r["onnxport"]), _plain(r["legacy"]), _plain(r["dynamo"]),
             f"{r['onnxport'].get('seconds', 0):.0f} / {r['legacy'].get('seconds', 0):.0f} / "
             f"{r['dynamo'].get('seconds', 0):.0f}") for r in rows]
    widths = [max(len(str(x[i])) for x in [hdr, *body]) for i in range(len(hdr))]
    for line in [hdr, tuple("-" * w for w in widths), *body]:
        print(" | ".join(str(v).ljust(w) for v, w in zip(line, widths)))
    s = summarize(rows)
    print(f"\nonnxport yes {s['onnxport_yes']}/{s['models']}, any-plain-exporter-correct "
          f"{s['any_plain_correct']}/{s['models']}, silent failures (onnxport exit 0 but independent check fails) "
          f"{s['silent_failures']}, said cannot tell (references that cannot tell a right file from a wrong one) "
          f"{s['cannot_tell']}")
    for r in rows:
        o = r["onnxport"]
        if o.get("exit") != 0 and o.get("error"):
            print(f"  {r['model']}: [{o['error'].get('code')}] {str(o['error'].get('message'))[:240]}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--_child":
        _child(*sys.argv[2:5])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], help="a model name (repeatable; substring match)")
    ap.add_argument("--skip", action="append", default=[], help="leave out a model (repeatable; substring match)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per onnxport run (default 600)")
    ap.add_argument("--plain-timeout", type=float, default=300, help="seconds per plain export + check (default 300)")
    ap.add_argument("--out", default=str(RESULTS), help=f"JSON results (default {RESULTS.relative_to(HERE.parent)})")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    ap.add_argument("--update", action="store_true",
                    help="merge into the existing --out file: replace the rows of the models run, keep the others")
    ap.add_argument("--table", action="store_true", help="print the table of the existing --out file and exit")
    args = ap.parse_args()
    if args.table:
        print_table(json.loads(Path(args.out).read_text())["models"])
        return
    todo = [c for c in cases() if (not args.only or any(o in c.name for o in args.only))
            and not any(s in c.name for s in args.skip)]
    if args.list:
        for c in todo:
            print(f"{c.name:40s} {c.source or 'file'}  dims {c.dims}  {c.note}")
        return
    if not todo:
        sys.exit(f"no model matches {args.only}; see --list")
    kept: list[dict] = []
    if args.update and Path(args.out).exists():
        names = {c.name for c in todo}
        kept = [r for r in json.loads(Path(args.out).read_text())["models"] if r["model"] not in names]
    rows: list[dict] = []
    for case in todo:
        print(f"== {case.name}", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="yes_rate-") as tmpd:
            tmp = Path(tmpd)
            row = {"model": case.name, "source": case.source or "file.py:build", "note": case.note,
                   "inputs": [list(map(str, s[2])) for s in case.inputs], "dims": case.dims,
                   "check_sizes": check_sizes(case)}
            row["onnxport"] = onnxport_export(case, tmp, args.timeout)
            print(f"   onnxport: {_ox(row['onnxport'])} ({row['onnxport']['seconds']} s)", file=sys.stderr, flush=True)
            row["legacy"] = run_child(case.name, "legacy", str(tmp / "legacy.onnx"), args.plain_timeout)
            print(f"   legacy:   {_plain(row['legacy'])} {row['legacy'].get('error') or ''}", file=sys.stderr,
                  flush=True)
            row["dynamo"] = run_child(case.name, "dynamo", str(tmp / "dynamo.onnx"), args.plain_timeout)
            print(f"   dynamo:   {_plain(row['dynamo'])} {row['dynamo'].get('error') or ''}", file=sys.stderr,
                  flush=True)
        rows.append(row)
        write(Path(args.out), _ordered(kept + rows), args)  # after every model: a run that is stopped keeps its rows
    print_table(_ordered(kept + rows))
    print(f"\nwrote {args.out}")


def _ordered(rows: list[dict]) -> list[dict]:
    order = {c.name: i for i, c in enumerate(cases())}
    return sorted(rows, key=lambda r: order.get(r["model"], len(order)))


def write(out: Path, rows: list[dict], args) -> None:
    import torch
    result = {"created_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch": torch.__version__,
              "timeout_s": args.timeout, "plain_timeout_s": args.plain_timeout,
              "tolerance": {"atol": ATOL, "rtol": RTOL}, "summary": summarize(rows), "models": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
