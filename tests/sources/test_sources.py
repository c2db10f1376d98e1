"""Model sources through ``onnxport.api.load_model``: every SOURCE form, its errors, weights and input specs.

Everything is built locally with random weights; nothing is downloaded.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from onnxport.api import load_model
from onnxport.core.errors import EXIT_USAGE, SourceError, UsageError
from onnxport.core.samples import export_sizes, make_inputs
from onnxport.core.spec import Dim, InputSpec
from onnxport.sources.base import LoadedModel
from tests.fixtures.models import TinyMLP

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
MODELS = FIXTURES / "models.py"
MORE = FIXTURES / "more_models.py"
MLP_IN = "x:float32[batch,8]"


def _src(path: Path, name: str) -> str:
    return f"{path}:{name}"


def _example(lm: LoadedModel, seed: int = 0) -> tuple[torch.Tensor, ...]:
    return make_inputs(lm.inputs, export_sizes(lm.dims), seed=seed)


def _run(lm: LoadedModel, seed: int = 0) -> tuple[torch.Tensor, ...]:
    with torch.inference_mode():
        return lm.flat(*_example(lm, seed))


def _usage(excinfo: pytest.ExceptionInfo) -> UsageError:
    """The raised error is a UsageError with exit code 2 and a non-empty hint."""
    e = excinfo.value
    assert isinstance(e, UsageError)
    assert e.exit_code == EXIT_USAGE == 2
    assert e.hint.strip(), f"no hint on {e.message!r}"
    assert e.message.strip()
    return e


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def _codes(lm: LoadedModel, code: str) -> list:
    return [d for d in lm.diagnostics if d.code == code]


# --------------------------------------------------------------------------- file.py:Class and module:factory


@pytest.mark.parametrize("model_args", ['{"hidden": 7, "classes": 5}', {"hidden": 7, "classes": 5}],
                         ids=["json", "dict"])
def test_file_class_with_model_args(model_args):
    lm = load_model(_src(MODELS, "TinyMLP"), inputs=[MLP_IN], dims=["batch=1..8"], model_args=model_args)
    assert lm.kind == "python" and lm.name == "TinyMLP"
    assert type(lm.model).__name__ == "TinyMLP"
    assert lm.model.fc1.out_features == 7 and lm.model.fc2.out_features == 5
    assert lm.inputs == (InputSpec("x", "float32", ("batch", 8)),)
    assert lm.dims == {"batch": Dim("batch", 1, 8, 2)}
    assert lm.output_names == ("output",)
    assert lm.parameters == 8 * 7 + 7 + 7 * 5 + 5
    assert not lm.model.training
    (out,) = _run(lm)
    assert out.shape == (2, 5)
    x = _example(lm)[0]
    with torch.inference_mode():
        torch.testing.assert_close(out, lm.model(x))


def test_module_factory_form(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    lm = load_model("tests.fixtures.models:make_mlp", inputs=[MLP_IN], model_args='{"classes": 6}')
    assert lm.kind == "python" and lm.name == "make_mlp"
    assert lm.source == "tests.fixtures.models:make_mlp"
    assert lm.model.fc2.out_features == 6
    assert _codes(lm, "train-mode") == []  # the factory returns an eval-mode model without Dropout
    assert _run(lm)[0].shape == (2, 6)


def test_module_instance_target(tmp_path):
    f = _write(tmp_path, "inst.py", """
        from torch import nn
        model = nn.Sequential(nn.Linear(3, 2))
    """)
    lm = load_model(_src(f, "model"), inputs=["x:float32[batch,3]"])
    assert type(lm.model).__name__ == "Sequential"
    assert _run(lm)[0].shape == (2, 2)
    with pytest.raises(UsageError) as ei:
        load_model(_src(f, "model"), inputs=["x:float32[batch,3]"], model_args={"a": 1})
    assert "--model-args" in _usage(ei).message


def test_dims_and_value_ranges_from_spec_are_kept():
    lm = load_model(_src(MODELS, "TinyText"), inputs=["input_ids:int64[batch,seq]{3..9}"],
                    dims=["batch=1..4", "seq=2..20"])
    assert lm.inputs[0].value_range == (3, 9)
    assert lm.dims["batch"].min == 1 and lm.dims["batch"].max == 4
    assert lm.dims["seq"].min == 2 and lm.dims["seq"].max == 20
    ids = _example(lm)[0]
    assert int(ids.min()) >= 3 and int(ids.max()) <= 9


# --------------------------------------------------------------------------- errors


def test_missing_model_file(tmp_path):
    missing = tmp_path / "nope.py"
    with pytest.raises(SourceError) as ei:
        load_model(_src(missing, "TinyMLP"), inputs=[MLP_IN])
    e = _usage(ei)
    assert str(missing) in e.message and "not found" in e.message


def test_model_file_with_syntax_error_names_the_line(tmp_path):
    f = _write(tmp_path, "broken.py", """\
        import torch


        class M(torch.nn.Module:
            pass
    """)
    with pytest.raises(SourceError) as ei:
        load_model(_src(f, "M"), inputs=[MLP_IN])
    e = _usage(ei)
    assert "syntax error" in e.message and "line 4" in e.message


def test_model_file_that_raises_on_import(tmp_path):
    f = _write(tmp_path, "raises.py", """\
        import torch

        raise RuntimeError("boom at import")
    """)
    with pytest.raises(SourceError) as ei:
        load_model(_src(f, "M"), inputs=[MLP_IN])
    e = _usage(ei)
    assert "RuntimeError" in e.message and "line 3" in e.message and "boom at import" in e.message


def test_unknown_class_hint_lists_module_classes(tmp_path):
    f = _write(tmp_path, "two.py", """
        from torch import nn
        from torch.nn import Linear  # imported, not defined here


        class Alpha(nn.Module):
            def forward(self, x):
                return x


        class Beta(nn.Module):
            def forward(self, x):
                return x


        class NotAModule:
            pass


        def helper():
            return Alpha()
    """)
    with pytest.raises(SourceError) as ei:
        load_model(_src(f, "Gamma"), inputs=[MLP_IN])
    e = _usage(ei)
    assert "'Gamma'" in e.message
    assert e.hint == "nn.Module classes there: Alpha, Beta"


def test_unknown_class_in_file_without_modules(tmp_path):
    f = _write(tmp_path, "empty.py", "X = 1\n")
    with pytest.raises(SourceError) as ei:
        load_model(_src(f, "Model"), inputs=[MLP_IN])
    assert "':'" in _usage(ei).hint


def test_target_that_is_not_a_model(tmp_path):
    with pytest.raises(SourceError) as ei:
        load_model(_src(MORE, "not_a_model"), inputs=[MLP_IN])
    assert "dict" in _usage(ei).message
    f = _write(tmp_path, "const.py", "WIDTH = 3\n")
    with pytest.raises(SourceError) as ei:
        load_model(_src(f, "WIDTH"), inputs=[MLP_IN])
    assert "int" in _usage(ei).message


def test_model_args_the_constructor_rejects():
    with pytest.raises(UsageError) as ei:
        load_model(_src(MODELS, "TinyMLP"), inputs=[MLP_IN], model_args='{"bogus": 1}')
    e = _usage(ei)
    assert "bogus" in e.message
    assert "features" in e.hint and "classes" in e.hint  # the hint shows the signature


def test_constructor_that_raises_valueerror():
    with pytest.raises(SourceError) as ei:
        load_model(_src(MORE, "Broken"), inputs=["x:float32[batch,4]"], model_args={"width": 0})
    e = _usage(ei)
    assert "ValueError" in e.message and "width must be positive" in e.message


@pytest.mark.parametrize(("text", "fragment"), [
    ("{bad json", "not valid JSON"),
    ('{"a": 1,}', "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('"classes"', "JSON object"),
    ("3", "JSON object"),
])
def test_model_args_not_json_or_not_object(text, fragment):
    with pytest.raises(UsageError) as ei:
        load_model(_src(MODELS, "TinyMLP"), inputs=[MLP_IN], model_args=text)
    e = _usage(ei)
    assert fragment in e.message and "--model-args" in e.message


def test_model_args_and_weights_rejected_for_non_python_sources(tmp_path):
    with pytest.raises(UsageError) as ei:
        load_model("torchvision:resnet18", model_args={"num_classes": 3})
    assert "--model-args" in _usage(ei).message
    with pytest.raises(UsageError) as ei:
        load_model(f"hf:{tmp_path}", weights=str(tmp_path / "w.pt"))
    assert "--weights" in _usage(ei).message


def test_unrecognised_source(tmp_path):
    with pytest.raises(UsageError) as ei:
        load_model(str(tmp_path / "model.onnx"))
    assert "cannot tell" in _usage(ei).message


def test_weights_with_mismatched_state_dict(tmp_path):
    w = tmp_path / "big.pt"
    torch.save(TinyMLP(hidden=32).state_dict(), w)
    with pytest.raises(SourceError) as ei:
        load_model(_src(MODELS, "TinyMLP"), inputs=[MLP_IN], weights=str(w))
    e = _usage(ei)
    assert "big.pt" in e.message and "do not fit" in e.message
    assert "--model-args" in e.hint
    # the same weights fit once --model-args builds the architecture they came from
    lm = load_model(_src(MODELS, "TinyMLP"), inputs=[MLP_IN], weights=str(w), model_args={"hidden": 32})
    assert lm.model.fc1.out_features == 32


def test_weights_with_missing_and_unexpected_keys(tmp_path):
    w = tmp_path / "keys.pt"
    state = TinyMLP().state_dict()
    state["fc3.weight"] = state.pop("fc2.weight")
    torch.save(state, w)
    with pytest.raises(SourceError) as ei:
        load_model(_src(MODELS, "TinyMLP"), inputs=[MLP_IN], weights=str(w))
    e = _usage(ei)
    assert "fc2.weight" in e.message or "fc3.weight" in e.message


def test_missing_weights_file(tmp_path):
    w = tmp_path / "absent.safetensors"
    with pytest.raises(SourceError) as ei:
        load_model(_src(MODELS, "TinyMLP"), inputs=[MLP_IN], weights=str(w))
    e = _usage(ei)
    assert str(w) in e.message and "not found" in e.message


def test_unreadable_weights_file(tmp_path):
    w = tmp_path / "junk.pt"
    w.write_bytes(b"this is not a checkpoint")
    with pytest.raises(SourceError) as ei:
        load_model(_src(MODELS, "TinyMLP"), inputs=[MLP_IN], weights=str(w))
    e = _usage(ei)
    assert "cannot read weights" in e.message and "state_dict" in e.hint


def test_weights_that_are_not_a_state_dict(tmp_path):
    w = tmp_path / "list.pt"
    torch.save([torch.zeros(2)], w)
    with pytest.raises(SourceError) as ei:
        load_model(_src(MODELS, "TinyMLP"), inputs=[MLP_IN], weights=str(w))
    assert "state_dict" in _usage(ei).message


def test_dim_the_model_cannot_vary_is_named():
    with pytest.raises(UsageError) as ei:
        load_model(_src(MODELS, "TinyMLP"), inputs=["x:float32[batch,feat]"], dims=["feat=2..64"])
    e = _usage(ei)
    assert "'feat'" in e.message and "cannot vary" in e.message
    assert "'batch'" not in e.message
    assert "'x' axis 1" in e.message


def test_input_name_that_does_not_fit_forward():
    with pytest.raises(UsageError) as ei:
        load_model(_src(MODELS, "TinyMLP"), inputs=[MLP_IN, "z:float32[batch,8]"])
    e = _usage(ei)
    assert "'z'" in e.message and "forward(x)" in e.message


def test_required_forward_parameter_without_input():
    with pytest.raises(UsageError) as ei:
        load_model(_src(MODELS, "DictOut"), inputs=["x:float32[batch,4]"])
    e = _usage(ei)
    assert "mask" in e.message and "mask" in e.hint


def test_duplicate_input_names():
    with pytest.raises(UsageError) as ei:
        load_model(_src(MODELS, "TinyMLP"), inputs=[MLP_IN, MLP_IN])
    assert "share a name" in _usage(ei).message


@pytest.mark.parametrize("source", [_src(MODELS, "TinyMLP"), "tests.fixtures.models:make_mlp"])
def test_model_without_input(source, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    with pytest.raises(UsageError) as ei:
        load_model(source)
    e = _usage(ei)
    assert "needs --input" in e.message and "-i" in e.hint


@pytest.mark.parametrize("name, shapes, sides", [
    ("TinyConv", ["x:float32[batch,3,height,width]"], (32, 512)),
    ("TwoImages", ["image1:float32[batch,3,height,width]", "image2:float32[batch,3,height,width]"], (32, 512)),
    ("TinyClip", ["clip:float32[batch,3,frames,height,width]"], (32, 160)),
])
def test_images_guessed_from_the_first_convolution(name, shapes, sides):
    lm = load_model(_src(MODELS, name))
    assert [str(s) for s in lm.inputs] == shapes
    (note,) = [d for d in lm.diagnostics if d.code == "inputs-guessed"]
    assert "first convolution" in note.message and "--input" in note.hint
    assert (lm.dims["height"].min, lm.dims["height"].max) == sides


def test_default_ranges_narrowed_when_the_largest_case_costs_too_much(monkeypatch):
    """Over the FLOP budget the guessed ranges shrink (batch to 4 first, then the sides, never to the export size,
    the batch last to its own) with a note naming the wider range; a declared --dim is never narrowed; within
    budget nothing changes."""
    import importlib

    finish = importlib.import_module("onnxport.sources.finish")
    monkeypatch.setattr(finish, "MAX_CASE_FLOPS", 1e6)
    lm = load_model(_src(MODELS, "TinyConv"))
    sizes = export_sizes(lm.dims)
    assert sizes["batch"] <= lm.dims["batch"].max <= 4 and sizes["height"] < lm.dims["height"].max < 512
    (note,) = [d for d in lm.diagnostics if d.code == "range-sized-by-cost"]
    assert "(not ..16)" in note.message and "TFLOPs" in note.message and "-d height=32..512" in note.hint
    declared = load_model(_src(MODELS, "TinyConv"), dims=[Dim("height", 32, 512)])
    assert declared.dims["height"].max == 512 and declared.dims["width"].max < 512
    monkeypatch.setattr(finish, "MAX_CASE_FLOPS", 1e15)
    assert not [d for d in load_model(_src(MODELS, "TinyConv")).diagnostics if d.code == "range-sized-by-cost"]


def test_sized_by_cost_takes_the_sides_down_evenly_and_listed_sizes_down_their_list():
    """A dim that takes listed sizes counts in the cost too (SAM2's Hiera: sides of listed sizes, batch 16 at
    896 x 896 was 12 GiB) and loses its sizes above the new top, never the first one above its export size."""
    from onnxport.sources.finish import sized_by_cost

    dims = {"batch": Dim("batch", 1, 16, 2), "height": Dim("height", 32, 512, 224),
            "width": Dim("width", 32, 512, 240), "n": Dim("n", 4, 64, 4, sizes=(4, 16, 64))}
    flops = 10**9  # the max case: 8 * (512/224) * (512/240) * 16 = 624x the example
    same, notes = sized_by_cost(dims, list(dims), flops, budget=700e9)
    assert same == dims and notes == ()
    new, (note,) = sized_by_cost(dims, list(dims), flops, budget=10e9)
    assert new["batch"].max == 4 and new["n"] == Dim("n", 4, 16, 4, sizes=(4, 16)) and "n 4..16 (not ..64)" in note.message
    assert abs(new["height"].max - new["width"].max) <= 32 and new["height"].max >= 256
    assert 2 * (new["height"].max / 224) * (new["width"].max / 240) * 4 <= 10
    floor, _ = sized_by_cost(dims, list(dims), flops, budget=1.0)  # the sides just above their export size,
    assert (floor["batch"].max, floor["height"].max, floor["width"].max, floor["n"].max) == (2, 256, 256, 16)
    assert floor["batch"].min == 1  # the batch last down to its export size: 1..2 still varies it
    only, _ = sized_by_cost({"batch": dims["batch"], "n": dims["n"]}, ["batch", "n"], flops, budget=10e9)
    assert (only["batch"].max, only["n"].sizes) == (4, (4, 16))  # listed sizes alone move too
    held, _ = sized_by_cost(dims, ["batch"], flops, budget=120e9)  # the sides declared (probed): batch pays
    assert held["batch"].max == 3 and all(held[s] == dims[s] for s in ("height", "width", "n"))


def test_sized_by_cost_counts_the_largest_tensor_too():
    """SAM's ViT: cheap enough in FLOPs at batch 3, but a 4096 x 4096 attention bias per head (1.6 GB at batch 2)
    held 16 GiB in the proof: the largest tensor binds, the batch gives way to its export size, the note says
    why in GiB."""
    from onnxport.sources.finish import MAX_CASE_TENSOR, sized_by_cost

    dims = {"batch": Dim("batch", 1, 16, 2)}
    small, notes = sized_by_cost(dims, ["batch"], 10**9, largest=10**6)
    assert small == dims and notes == ()
    big, (note,) = sized_by_cost(dims, ["batch"], 10**9, largest=int(0.8 * MAX_CASE_TENSOR))
    assert big["batch"].max == 2 and "GiB for its largest tensor" in note.message and "TFLOPs" not in note.message


def test_made_up_sides_can_be_fixed_declared_ones_never():
    """The guessed image's sides (not batch) may be fixed at their export sizes when no ranged file is proven:
    the inputs say the sizes, the dims lose them, a range-fixed warning says why; a declared side is kept."""
    from onnxport.sources.finish import at_fixed_sizes

    lm = load_model(_src(MODELS, "TinyConv"))
    sizes = export_sizes(lm.dims)
    fixed = at_fixed_sizes(lm, "16 of 20 cases fail")
    assert fixed is not None and set(fixed.dims) == {"batch"}
    assert fixed.inputs[0].shape == ("batch", lm.inputs[0].shape[1], sizes["height"], sizes["width"])
    (note,) = [d for d in fixed.diagnostics if d.code == "range-fixed"]
    assert "16 of 20 cases fail" in note.message and f"height {sizes['height']} (not 32..512)" in note.message
    x = make_inputs(fixed.inputs, {"batch": 2}, seed=0)
    torch.testing.assert_close(fixed.flat(*x)[0], lm.flat(*x)[0])
    assert at_fixed_sizes(fixed, "again") is None  # once
    declared = load_model(_src(MODELS, "TinyConv"), dims=[Dim("height", 32, 512), Dim("width", 32, 512)])
    assert at_fixed_sizes(declared, "why") is None


def test_a_transformers_model_handed_over_as_python_gets_the_inputs_hf_makes_up(tmp_path):
    """A factory returning a transformers model (no folder): its inputs come from its forward and config, as for
    hf:DIR, token ids within its vocabulary."""
    path = tmp_path / "bert_factory.py"
    path.write_text(textwrap.dedent("""
        import transformers

        def tiny_bert():
            config = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, intermediate_size=37,
                                             max_position_embeddings=64)
            return transformers.BertForSequenceClassification(config)
    """))
    lm = load_model(f"{path}:tiny_bert")
    assert [s.name for s in lm.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    assert lm.inputs[0].value_range == (0, 98) and lm.dims["seq"].max == 64
    assert lm.output_names == ("logits",)


def test_a_guess_that_does_not_fit_says_so_and_asks_for_input(tmp_path):
    path = tmp_path / "gray.py"
    path.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class Flat(nn.Module):  # a conv model fed a flat vector it reshapes itself: the image guess fails
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(1, 2, 3)

            def forward(self, x):
                return self.conv(x.reshape(-1, 1, 28, 28))
    """))
    with pytest.raises(UsageError) as ei:
        load_model(f"{path}:Flat")
    e = _usage(ei)
    assert "needs --input" in e.message and "guessed from its first convolution" in e.message and "-i" in e.hint


def test_model_that_fails_on_its_example_inputs():
    with pytest.raises(UsageError) as ei:
        load_model(_src(MODELS, "TinyMLP"), inputs=["x:float32[batch,5]"])
    e = _usage(ei)
    assert "fails on the example inputs" in e.message and "x:float32[batch,5]" in e.message


def test_module_form_that_cannot_be_found():
    with pytest.raises(SourceError) as ei:
        load_model("no_such_pkg_onnxport.models:Net", inputs=[MLP_IN])
    assert "no_such_pkg_onnxport" in _usage(ei).message


def test_module_form_that_fails_to_import(tmp_path, monkeypatch):
    pkg = tmp_path / "brokenpkg_onnxport"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text("from torch import no_such_name_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SourceError) as ei:
        load_model("brokenpkg_onnxport.models:Net", inputs=[MLP_IN])
    assert "no_such_name_anywhere" in _usage(ei).message


# --------------------------------------------------------------------------- weights


def _random_mlp_state(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: v.clone() for k, v in TinyMLP(classes=4).state_dict().items()}


@pytest.mark.parametrize("fmt", ["pt", "safetensors", "wrapped"])
def test_weights_load_exactly(tmp_path, fmt):
    state = _random_mlp_state(seed=1234)
    if fmt == "safetensors":
        from safetensors.torch import save_file

        w = tmp_path / "w.safetensors"
        save_file(state, str(w))
    elif fmt == "wrapped":
        w = tmp_path / "ckpt.pth"
        torch.save({"state_dict": state, "epoch": 3}, w)
    else:
        w = tmp_path / "w.pt"
        torch.save(state, w)
    lm = load_model(_src(MODELS, "TinyMLP"), inputs=[MLP_IN], model_args={"classes": 4}, weights=str(w))
    got = lm.model.state_dict()
    assert set(got) == set(state)
    for k, v in state.items():
        assert torch.equal(got[k], v), k
    # and the flat wrapper computes with them
    x = _example(lm)[0]
    ref = TinyMLP(classes=4)
    ref.load_state_dict(state)
    with torch.inference_mode():
        torch.testing.assert_close(lm.flat(x)[0], ref.eval()(x), rtol=0, atol=0)


# --------------------------------------------------------------------------- TorchScript and ExportedProgram


@pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")
def test_torchscript_loads_with_input(tmp_path):
    torch.manual_seed(0)
    ref = TinyMLP().eval()
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(ref), str(path))
    lm = load_model(str(path), inputs=[MLP_IN], dims=["batch=1..16"])
    assert lm.kind == "torchscript" and lm.name == "scripted"
    assert isinstance(lm.model, torch.jit.ScriptModule)
    assert lm.inputs == (InputSpec("x", "float32", ("batch", 8)),)
    assert lm.dims["batch"] == Dim("batch", 1, 16, 2)
    assert lm.output_names == ("output",)
    assert lm.parameters == sum(p.numel() for p in ref.parameters())
    x = _example(lm)[0]
    with torch.inference_mode():
        torch.testing.assert_close(lm.flat(x)[0], ref(x))


@pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")
def test_torchscript_needs_input(tmp_path):
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(TinyMLP()), str(path))
    with pytest.raises(UsageError) as ei:
        load_model(str(path))
    assert "needs --input" in _usage(ei).message


@pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")
def test_state_dict_pt_is_not_torchscript(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save(TinyMLP().state_dict(), path)
    with pytest.raises(SourceError) as ei:
        load_model(str(path), inputs=[MLP_IN])
    e = _usage(ei)
    assert "not a TorchScript model" in e.message
    assert "--weights" in e.hint and str(path) in e.hint


@pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")
def test_legacy_format_state_dict_pt_hint_mentions_weights(tmp_path):
    path = tmp_path / "legacy.pt"
    torch.save(TinyMLP().state_dict(), path, _use_new_zipfile_serialization=False)
    with pytest.raises(SourceError) as ei:
        load_model(str(path), inputs=[MLP_IN])
    assert "--weights" in _usage(ei).hint


@pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")
def test_missing_torchscript_and_exported_program_files(tmp_path):
    for name in ("gone.pt", "gone.pt2"):
        with pytest.raises(SourceError) as ei:
            load_model(str(tmp_path / name), inputs=[MLP_IN])
        assert "not found" in _usage(ei).message


def test_pt2_that_is_not_an_exported_program(tmp_path):
    path = tmp_path / "junk.pt2"
    path.write_bytes(b"not a program")
    with pytest.raises(SourceError) as ei:
        load_model(str(path))
    assert "not an ExportedProgram" in _usage(ei).message


@pytest.fixture(scope="module")
def pt2_file(tmp_path_factory) -> tuple[Path, TinyMLP]:
    torch.manual_seed(0)
    ref = TinyMLP().eval()
    ep = torch.export.export(ref, (torch.randn(2, 8),),
                             dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=32)},))
    path = tmp_path_factory.mktemp("pt2") / "m.pt2"
    torch.export.save(ep, str(path))
    return path, ref


def test_exported_program_input_specs_are_read(pt2_file):
    """The reading of specs and ranges works on its own (the load itself is tested below)."""
    from onnxport.sources.serialized import _ep_inputs

    specs, defaults = _ep_inputs(torch.export.load(str(pt2_file[0])))
    assert len(specs) == 1
    (spec,) = specs
    assert spec.name == "x" and spec.dtype == "float32"
    sym = spec.shape[0]
    assert isinstance(sym, str) and spec.shape[1:] == (8,)
    assert (defaults[sym].min, defaults[sym].max, defaults[sym].example) == (1, 32, 2)


def test_exported_program_loads_without_input(pt2_file):
    path, ref = pt2_file
    lm = load_model(str(path))
    assert lm.kind == "exported_program" and lm.name == "m"
    (spec,) = lm.inputs
    assert spec.name == "x" and spec.dtype == "float32"
    sym = spec.shape[0]
    assert isinstance(sym, str) and spec.shape[1:] == (8,)
    assert (lm.dims[sym].min, lm.dims[sym].max) == (1, 32)
    assert lm.output_names == ("output",)
    assert "exported_program" in lm.extra
    x = _example(lm)[0]
    with torch.inference_mode():
        torch.testing.assert_close(lm.flat(x)[0], ref(x))


# --------------------------------------------------------------------------- torchvision and timm


def test_torchvision_resnet18_without_input():
    lm = load_model("torchvision:resnet18")
    assert lm.kind == "torchvision" and lm.name == "resnet18"
    assert lm.inputs == (InputSpec("image", "float32", ("batch", 3, "height", "width")),)
    assert set(lm.dims) == {"batch", "height", "width"}
    assert (lm.dims["batch"].min, lm.dims["batch"].max) == (1, 16)
    assert (lm.dims["height"].min, lm.dims["height"].max) == (32, 512)
    ex = export_sizes(lm.dims)
    assert len({ex["batch"], ex["height"], ex["width"]}) == 3  # distinct export sizes
    assert lm.output_names == ("output",)
    assert lm.parameters > 11_000_000
    assert not lm.model.training
    (diag,) = _codes(lm, "train-mode")  # constructed here with BatchNorm: noted, not warned
    assert diag.severity == "info"


def test_unknown_torchvision_model():
    with pytest.raises(SourceError) as ei:
        load_model("torchvision:resnet_does_not_exist")
    e = _usage(ei)
    assert "resnet_does_not_exist" in e.message
    assert "resnet" in e.hint  # suggests close names


def test_timm_small_model_without_input():
    lm = load_model("timm:test_resnet")
    assert lm.kind == "timm" and lm.name == "test_resnet"
    assert lm.inputs == (InputSpec("image", "float32", ("batch", 3, "height", "width")),)
    assert lm.dims["height"].example == 160 and lm.dims["height"].max == 512
    assert lm.output_names == ("output",)
    out = _run(lm)[0]
    assert out.shape[0] == export_sizes(lm.dims)["batch"]


def test_timm_vit_fixed_input_size():
    lm = load_model("timm:test_vit")
    (spec,) = lm.inputs
    assert spec.shape == ("batch", 3, 160, 160)
    assert all(isinstance(d, int) for d in spec.shape[1:])
    assert set(lm.dims) == {"batch"}


def test_unknown_timm_model():
    with pytest.raises(SourceError) as ei:
        load_model("timm:no_such_timm_net")
    assert "no_such_timm_net" in _usage(ei).message


# --------------------------------------------------------------------------- Hugging Face directories


def _tiny_bert_config(arch: str, **kw):
    import transformers

    return transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=37, max_position_embeddings=64, type_vocab_size=2,
                                   architectures=[arch], **kw)


def _save_tokenizer(d: Path) -> None:
    import transformers

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(95)]
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(d / "vocab.txt")).save_pretrained(str(d))


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    import transformers

    d = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    transformers.BertModel(_tiny_bert_config("BertModel")).save_pretrained(str(d))
    _save_tokenizer(d)
    return d


@pytest.fixture(scope="module")
def bert_cls_dir(tmp_path_factory) -> Path:
    import transformers

    d = tmp_path_factory.mktemp("tiny-bert-cls")
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(
        _tiny_bert_config("BertForSequenceClassification", num_labels=3)).save_pretrained(str(d))
    _save_tokenizer(d)
    return d


TEXT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


def test_hf_tiny_bert(bert_dir):
    lm = load_model(f"hf:{bert_dir}")
    assert lm.kind == "hf" and lm.name == "BertModel"
    assert lm.extra["model_type"] == "bert" and lm.extra["architecture"] == "BertModel"
    assert tuple(s.name for s in lm.inputs) == TEXT_NAMES
    assert all(s.dtype == "int64" and s.shape == ("batch", "seq") for s in lm.inputs)
    assert [s.value_range for s in lm.inputs] == [(0, 99), (0, 1), (0, 1)]
    assert set(lm.dims) == {"batch", "seq"}
    assert lm.dims["seq"].max == 64 and lm.dims["seq"].min == 1
    assert lm.output_names == ("last_hidden_state", "pooler_output")
    assert not lm.model.training
    last, pooled = _run(lm)
    ex = export_sizes(lm.dims)
    assert last.shape == (ex["batch"], ex["seq"], 32) and pooled.shape == (ex["batch"], 32)


def test_hf_directory_without_prefix(bert_dir):
    lm = load_model(str(bert_dir))
    assert lm.kind == "hf" and lm.name == "BertModel"
    assert tuple(s.name for s in lm.inputs) == TEXT_NAMES


def test_hf_architecture_from_config(bert_cls_dir):
    lm = load_model(f"hf:{bert_cls_dir}")
    assert lm.name == "BertForSequenceClassification"
    assert lm.output_names == ("logits",)
    (logits,) = _run(lm)
    assert logits.shape == (export_sizes(lm.dims)["batch"], 3)


def test_hf_task_builds_the_task_class(bert_dir):
    lm = load_model(f"hf:{bert_dir}", task="text-classification")
    assert type(lm.model).__name__ == "BertForSequenceClassification"
    assert lm.output_names == ("logits",)
    assert tuple(s.name for s in lm.inputs) == TEXT_NAMES


def test_hf_unknown_task(bert_dir):
    with pytest.raises(SourceError) as ei:
        load_model(f"hf:{bert_dir}", task="make-coffee")
    e = _usage(ei)
    assert "make-coffee" in e.message and "text-classification" in e.hint


def test_hf_dir_without_config(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n")
    with pytest.raises(SourceError) as ei:
        load_model(f"hf:{tmp_path}")
    assert "config.json" in _usage(ei).message
    with pytest.raises(SourceError) as ei:
        load_model(f"hf:{tmp_path / 'missing'}")
    assert "not found" in _usage(ei).message


def test_hf_dir_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_tiny_bert_config("BertModel").to_dict()))
    with pytest.raises(SourceError) as ei:
        load_model(f"hf:{tmp_path}")
    assert "cannot load the model" in _usage(ei).message


def test_hf_minilm(minilm_dir):
    lm = load_model(f"hf:{minilm_dir}")
    assert tuple(s.name for s in lm.inputs) == TEXT_NAMES
    assert all(s.dtype == "int64" and s.shape == ("batch", "seq") for s in lm.inputs)
    assert lm.inputs[0].value_range == (0, 30521)
    assert set(lm.dims) == {"batch", "seq"}
    assert lm.dims["seq"].max == 512
    assert lm.output_names == ("last_hidden_state", "pooler_output")


# --------------------------------------------------------------------------- binding and output names


def test_dict_output_with_keyword_only_mask():
    lm = load_model(_src(MODELS, "DictOut"), inputs=["x:float32[batch,4]", "mask:int64[batch,3]"])
    assert lm.flat._binding == [("kw", "x"), ("kw", "mask")]
    assert lm.inputs[1].value_range == (0, 1)
    assert lm.output_names == ("logits", "extra_0", "extra_1")
    x, mask = _example(lm)
    outs = _run(lm)
    assert len(outs) == len(lm.output_names) == 3
    with torch.inference_mode():
        ref = lm.model(x, mask=mask)
    torch.testing.assert_close(outs[0], ref["logits"])
    torch.testing.assert_close(outs[1], ref["extra"][0])
    assert torch.equal(outs[2], mask.sum(-1))


def test_dict_output_inputs_in_any_order():
    lm = load_model(_src(MODELS, "DictOut"), inputs=["mask:int64[batch,3]", "features:float32[batch,4]"])
    assert lm.flat._binding == [("kw", "mask"), ("kw", "x")]
    mask, x = _example(lm)
    outs = _run(lm)
    assert outs[2].shape == (2,) and torch.equal(outs[2], mask.sum(-1))
    with torch.inference_mode():
        torch.testing.assert_close(outs[0], lm.model(x, mask=mask)["logits"])


def test_tuple_output_names_skip_non_tensors():
    lm = load_model(_src(MORE, "TupleOut"), inputs=["x:float32[batch,4]"])
    assert lm.output_names == ("output_0", "output_1_0", "output_1_1")
    assert len(_run(lm)) == 3


def test_positional_only_parameter():
    lm = load_model(_src(MORE, "PosOnly"), inputs=["a:float32[batch,4]", "y:float32[batch,4]"])
    assert lm.flat._binding == [("pos", 0), ("kw", "y")]
    a, y = _example(lm)
    with torch.inference_mode():
        torch.testing.assert_close(_run(lm)[0], lm.model(a, y))


def test_var_positional_forward():
    lm = load_model(_src(MORE, "VarArgs"), inputs=["x:float32[batch,4]", "extra:float32[batch,4]"])
    x, extra = _example(lm)
    with torch.inference_mode():
        torch.testing.assert_close(_run(lm)[0], lm.model(x, extra))


# --------------------------------------------------------------------------- train mode


def test_factory_in_train_mode_warns_and_switches_to_eval():
    lm = load_model(_src(MORE, "make_training_dropnet"), inputs=["x:float32[batch,4]"])
    (diag,) = _codes(lm, "train-mode")
    assert diag.severity == "warning"
    assert diag.module == "drop" and "Dropout" in diag.message and diag.hint
    assert not lm.model.training
    assert not any(m.training for m in lm.model.modules())
    first, second = _run(lm)[0], _run(lm)[0]
    assert torch.equal(first, second)  # Dropout is off


def test_class_built_by_onnxport_is_only_info():
    lm = load_model(_src(MORE, "DropNet"), inputs=["x:float32[batch,4]"])
    (diag,) = _codes(lm, "train-mode")
    assert diag.severity == "info"
    assert not lm.model.training


def test_factory_in_eval_mode_has_no_train_mode_diagnostic():
    lm = load_model(_src(MORE, "make_eval_dropnet"), inputs=["x:float32[batch,4]"])
    assert _codes(lm, "train-mode") == []


def test_class_in_file_with_dropout_is_info():
    # TinyText is a class (constructed by onnxport): its TransformerEncoder dropouts are only noted.
    lm = load_model(_src(MODELS, "TinyText"), inputs=["input_ids:int64[batch,seq]"])
    (diag,) = _codes(lm, "train-mode")
    assert diag.severity == "info" and "3 Dropout" in diag.message


# --------------------------------------------------------------------------- integer value ranges


def test_integer_value_range_from_embedding():
    lm = load_model(_src(MODELS, "TinyText"), inputs=["input_ids:int64[batch,seq]"])
    assert lm.inputs == (InputSpec("input_ids", "int64", ("batch", "seq"), (0, 49)),)
    ids = _example(lm)[0]
    assert int(ids.min()) >= 0 and int(ids.max()) <= 49


def test_integer_value_range_follows_model_args():
    lm = load_model(_src(MODELS, "TinyText"), inputs=["input_ids:int64[batch,seq]"], model_args={"vocab_size": 20})
    assert lm.inputs[0].value_range == (0, 19)


def test_integer_value_range_without_embedding(tmp_path):
    f = _write(tmp_path, "idx.py", """
        import torch
        from torch import nn


        class Gather(nn.Module):
            def __init__(self):
                super().__init__()
                self.table = nn.Parameter(torch.randn(10, 3))

            def forward(self, idx):
                return self.table[idx]
    """)
    lm = load_model(_src(f, "Gather"), inputs=["idx:int64[batch]"])
    assert lm.inputs[0].value_range == (0, 9)
    assert isinstance(lm.model, nn.Module)


def test_hf_architecture_no_class_is_named(bert_dir, tmp_path):
    """config.json naming no class of this transformers: loaded as the base model, said in a warning."""
    import json
    import shutil

    d = tmp_path / "arch"
    shutil.copytree(bert_dir, d)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchModelClass"]}))
    lm = load_model(f"hf:{d}")
    found = [x for x in lm.diagnostics if x.code == "architecture-unknown"]
    assert lm.name == "BertModel" and found and "NoSuchModelClass" in found[0].message
    assert not [x for x in load_model(f"hf:{bert_dir}").diagnostics if x.code == "architecture-unknown"]


def test_the_model_as_found_drops_what_its_runs_cached_and_keeps_its_weights():

    lm = load_model(f"{MODELS}:CachedGrid")  # the example run at the export size cached its grid
    model = lm.model
    assert model.shape is not None and hasattr(model, "grid")
    weight = model.conv.weight
    lm.flat.as_found()
    assert model.shape is None and not hasattr(model, "grid") and not model.training
    assert model.conv.weight is weight
