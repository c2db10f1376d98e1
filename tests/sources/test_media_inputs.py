"""Inputs made up for video clips, two-image models, spectrogram audio, an audio tower beside a text tower and
models that run at one size only, with no --input: Hugging Face video classifiers, AST and CLAP as saved
(tiny configs), torchvision's video and optical-flow models, and a model built for one size."""

from __future__ import annotations

import pytest
import torch
import torchvision
import transformers as T
from torch import nn

from onnxport.api import load_model
from onnxport.core.spec import Dim, InputSpec
from onnxport.sources.finish import Finishing, finish
from onnxport.sources.vision import _image_params, _one_size, _torchvision_dims, _weights_meta
from tests.conftest import load_report
from tests.fixtures.in_process import run_cli_here

TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)


def _models() -> dict:
    audio = dict(spec_size=64, num_mel_bins=16, patch_embeds_hidden_size=16, hidden_size=32, depths=[1, 1],
                 num_attention_heads=[2, 2], window_size=4)
    return {
        "videomae": lambda: T.VideoMAEForVideoClassification(T.VideoMAEConfig(
            image_size=32, patch_size=16, num_frames=4, tubelet_size=2, num_labels=3, **TINY)),
        "timesformer": lambda: T.TimesformerForVideoClassification(T.TimesformerConfig(
            image_size=32, patch_size=16, num_frames=2, num_labels=3, **TINY)),
        "vivit": lambda: T.VivitForVideoClassification(T.VivitConfig(
            image_size=32, num_frames=4, tubelet_size=[2, 16, 16], num_labels=3, **TINY)),
        "ast": lambda: T.ASTForAudioClassification(T.ASTConfig(max_length=32, num_mel_bins=16, num_labels=3,
                                                               **TINY)),
        "clap": lambda: T.ClapModel(T.ClapConfig(
            projection_dim=16, text_config=dict(vocab_size=99, max_position_embeddings=40, **TINY),
            audio_config=audio)),
        "siglip2": lambda: T.Siglip2Model(T.Siglip2Config(
            text_config=dict(vocab_size=99, max_position_embeddings=40, **TINY),
            vision_config=dict(num_patches=16, patch_size=8, **TINY))),
    }


EXPECTED = {  # name -> the inputs made up, as `onnxport export` prints them
    "videomae": ["pixel_values:float32[batch,4,3,32,32]"],
    "timesformer": ["pixel_values:float32[batch,2,3,32,32]"],
    "vivit": ["pixel_values:float32[batch,4,3,32,32]"],
    "ast": ["input_values:float32[batch,32,16]"],
    "clap": ["input_ids:int64[batch,seq]{0..98}", "attention_mask:int64[batch,seq]{0..1}",
             "input_features:float32[batch,1,frames,16]"],
    "siglip2": ["input_ids:int64[batch,seq]{0..98}", "attention_mask:int64[batch,seq]{0..1}", "pixel_values:float32[1,16,192]",
                "pixel_attention_mask:int64[1,16]{1..1}", "spatial_shapes:int64[1,2]{4..4}"],
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("media_inputs")
    torch.manual_seed(0)
    for name, make in _models().items():
        make().save_pretrained(root / name)
    return root


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_inputs_come_from_each_config(saved, name):
    loaded = load_model(f"hf:{saved / name}")
    assert [str(s) for s in loaded.inputs] == EXPECTED[name]


def test_clap_frames_reach_the_audio_towers_window(saved):
    """CLAP's audio tower stretches its frames to spec_size x (spec_size // mel bins), 64 x 4: up to one less (at
    the window itself it skips the stretch, a shape test the ONNX graph would not keep)."""
    loaded = load_model(f"hf:{saved / 'clap'}")
    assert (loaded.dims["frames"].min, loaded.dims["frames"].max) == (16, 255)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["videomae", "ast", "siglip2"])
def test_exported_and_proven(saved, tmp_path, name, monkeypatch, capsys):
    r = run_cli_here(monkeypatch, capsys, "export", f"hf:{saved / name}", "-o", str(tmp_path / name))
    assert r.returncode == 0, r.stdout + r.stderr
    assert load_report(tmp_path / name)["status"] == "ok"


# --------------------------------------------------------------------------- torchvision


def test_a_video_models_dims_come_from_its_weights_metadata():
    """A clip's sides start at the weights' min_size and its frames at their min_temporal_size (S3D's pooling
    needs 224 x 224 and 14 frames); without them, small clips."""
    s3d = _torchvision_dims("s3d", _weights_meta(torchvision, "s3d"), video=True)
    assert (s3d["height"].min, s3d["frames"].min, s3d["frames"].example) == (224, 14, 14)
    r3d = _torchvision_dims("r3d_18", _weights_meta(torchvision, "r3d_18"), video=True)
    assert (r3d["frames"].min, r3d["height"].min, r3d["height"].max) == (1, 32, 160)
    assert _one_size(_weights_meta(torchvision, "mvit_v2_s"), True) == {"height": 224, "width": 224, "frames": 16}


def test_optical_flow_takes_two_images_each_side_a_multiple_of_8():
    raft = torchvision.models.get_model("raft_small", weights=None)
    assert _image_params(raft) == ("image1", "image2")
    assert _image_params(torchvision.models.get_model("resnet18", weights=None)) == ("image",)
    dims = _torchvision_dims("raft_small", _weights_meta(torchvision, "raft_small"), video=False, flow=True)
    assert dims["height"].sizes[:3] == (128, 136, 144) and dims["width"].rule == "multiples of 8"


@pytest.mark.slow
def test_torchvision_video_model_takes_a_clip():
    loaded = load_model("torchvision:r3d_18")
    assert [str(s) for s in loaded.inputs] == ["video:float32[batch,3,frames,height,width]"]
    assert loaded.dims["frames"].min == 1


class OneSize(nn.Module):
    """Runs at 32 x 32 only (a window partition built for that size, like MaxViT's)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(32 * 32, 4)

    def forward(self, x):
        return self.proj(x.reshape(x.shape[0], 3, 32 * 32)).mean(1)


def _one_size_model(one_size):
    specs = [InputSpec("image", "float32", ("batch", 3, "height", "width"))]
    defaults = {"height": Dim("height", 16, 96, 32), "width": Dim("width", 16, 96, 48)}
    return finish("x", "one", "python", OneSize(), specs, [],
                  Finishing(defaults=defaults, built_here=True, one_size=one_size))


def test_a_model_built_for_one_size_is_loaded_at_it_with_a_note():
    loaded = _one_size_model({"height": 32, "width": 32})
    assert [str(s) for s in loaded.inputs] == ["image:float32[batch,3,32,32]"]
    (note,) = [d for d in loaded.diagnostics if d.code == "one-size"]
    assert "height 32 (fails at 64, 16, 96)" in note.message and "proven at that size" in note.message


def test_a_size_that_does_not_run_either_is_not_taken():
    with pytest.raises(Exception, match="fails on the example inputs"):
        _one_size_model({"height": 40, "width": 40})


def test_zero_initialised_heads_of_a_named_model_get_random_weights_said_in_a_note():
    """torchvision's ViT initialises its head to zeros: every output 0 for every input, which no proof can tell
    from anything. The head gets PyTorch's default initialisation and a note; other weights stay as built."""
    from onnxport.sources.vision import lively

    torch.manual_seed(0)
    vit = torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=1, num_heads=2,
                                               hidden_dim=16, mlp_dim=16, num_classes=3).eval()
    before = {k: v.clone() for k, v in vit.state_dict().items()}
    with torch.inference_mode():
        assert not vit(torch.randn(2, 3, 32, 32)).any()
    (note,) = lively(vit)
    assert note.code == "random-weights-lively" and note.message.startswith("heads.head: all-zero")
    changed = {k for k, v in vit.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == {"heads.head.weight", "heads.head.bias"}
    with torch.inference_mode():
        a, b = vit(torch.randn(2, 3, 32, 32)), vit(torch.randn(2, 3, 32, 32))
    assert a.abs().min() > 0 and not torch.allclose(a, b)
    assert lively(torchvision.models.get_model("resnet18", weights=None)) == ()


def _vanishing(depth: int = 12, std: float = 0.01) -> nn.Module:
    """GoogLeNet's kind of random weights: std 0.01 convolutions with biases, so by the last layer the output is
    the biases' alone, one for every input (std 1: Inception v3's kind, activations growing layer by layer)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for i in range(depth):
        conv = nn.Conv2d(3 if i == 0 else 8, 8, 3, padding=1)
        nn.init.normal_(conv.weight, std=std)
        nn.init.constant_(conv.bias, 0.1)
        layers += [conv, nn.ReLU()]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)).eval()


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.norm(self.conv(x))


def test_residual_sums_that_grow_with_any_weights_get_measured_batch_norms():
    """ResNet-101's kind: each block adds to the sum, so with batch norms at their initial statistics the outputs
    grow past 1e4 whatever the weights; statistics measured on a random batch normalise each block's term."""
    from onnxport.sources.vision import awake, unlike

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), *[_Residual() for _ in range(40)]).eval()
    for m in net.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.normal_(m.weight, std=1.0)
    spec = [InputSpec("image", "float32", ("batch", 3, "height", "width"))]
    dims = {"batch": Dim("batch", 1, 4, 2), "height": Dim("height", 8, 32, 16), "width": Dim("width", 8, 32, 16)}
    lm = finish("x", "residual", "torchvision", net, spec, [], Finishing(defaults=dims, built_here=True))
    assert unlike(lm).startswith("as large as")
    woken = awake(lm)
    assert unlike(woken) is None and not net.training and not any(m.training for m in net.modules())
    (note,) = [d for d in woken.diagnostics if d.code == "random-weights-lively"]
    assert "batch norms got the statistics of a random batch" in note.message
    assert "(He, fan in) and its batch norms" in note.message  # He's weights kept: the norms measured on them


def test_random_weights_that_give_one_output_for_every_input_are_woken_with_a_note():
    from onnxport.sources.vision import awake, unlike

    spec = [InputSpec("image", "float32", ("batch", 3, "height", "width"))]
    dims = {"batch": Dim("batch", 1, 4, 2), "height": Dim("height", 8, 32, 16), "width": Dim("width", 8, 32, 16)}
    lm = finish("x", "vanishing", "torchvision", _vanishing(), spec, [], Finishing(defaults=dims, built_here=True))
    assert unlike(lm) == "the same for every input"
    woken = awake(lm)
    assert unlike(woken) is None
    (note,) = [d for d in woken.diagnostics if d.code == "random-weights-lively"]
    assert "same for every input" in note.message
    healthy = finish("x", "healthy", "torchvision", _vanishing(depth=1), spec, [],
                     Finishing(defaults=dims, built_here=True))
    assert unlike(healthy) is None and awake(healthy) is healthy
    loud = finish("x", "loud", "torchvision", _vanishing(std=1.0), spec, [], Finishing(defaults=dims, built_here=True))
    assert unlike(loud).startswith("as large as")
    woken = awake(loud)
    assert unlike(woken) is None and [d for d in woken.diagnostics if d.code == "random-weights-lively"]
    torch.manual_seed(0)
    head = nn.Linear(8, 5)
    nn.init.normal_(head.weight, std=1e-12)
    nn.init.zeros_(head.bias)  # every score 1/5 to float32's precision: tied, as SSDlite's random head ties them
    tied = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), head, nn.Softmax(-1))
    tied_lm = finish("x", "tied", "torchvision", tied.eval(), spec, [], Finishing(defaults=dims, built_here=True))
    assert unlike(tied_lm).startswith("one value throughout") and unlike(awake(tied_lm)) is None
    biased = _vanishing(depth=1)
    nn.init.constant_(biased[-1].bias, 1e6)  # as loud with any weights: its own given back
    stuck = finish("x", "stuck", "torchvision", biased, spec, [], Finishing(defaults=dims, built_here=True))
    before = [p.detach().clone() for p in stuck.model.parameters()]
    assert awake(stuck) is stuck and all(torch.equal(a, b) for a, b in zip(before, stuck.model.parameters()))
