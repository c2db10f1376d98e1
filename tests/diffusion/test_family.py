"""The diffusion family: diffusers folders as save_pretrained writes them (random weights, nothing downloaded),
each exported by the one pipeline with inputs made up from its config and proven; a whole pipeline folder
into Optimum's layout, each model proven alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from onnxport import api, families
from onnxport.core.errors import SourceError, UsageError
from onnxport.diffusion.component import load
from onnxport.diffusion.parts import parts
from tests.conftest import load_report, run_cli
from tests.fixtures import diffusers_models as dm


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("diffusers")
    for kind in ("unet", "vae", "sd3", "flux", "pixart", "unet2d", "controlnet"):
        dm.save_component(root / kind, kind)
    dm.save_pipeline(root / "pipeline")
    return root


def test_diffusers_folders_are_the_diffusion_family(folders):
    for kind in ("unet", "vae", "sd3", "flux", "pipeline"):
        assert families.detect(f"hf:{folders / kind}", None).name == "diffusion", kind
    assert families.detect(f"hf:{folders / 'pipeline' / 'text_encoder'}", None).name == "model"
    assert families.detect(str(folders / "unet"), None).name == "diffusion"  # a folder as it is: hf:DIR
    # --input is the plain forward, exported as declared
    assert families.detect(f"hf:{folders / 'unet'}", None, inputs_given=True).name == "model"


def test_input_on_a_diffusers_folder_is_one_line_naming_what_to_do(folders, tmp_path):
    proc = run_cli("export", f"hf:{folders / 'unet'}", "-o", str(tmp_path / "o"), "-i", "sample:float32[1,4,8,8]")
    assert proc.returncode == 2 and "diffusers model (UNet2DConditionModel)" in proc.stderr, proc.stderr[-2000:]
    assert "leave --input out" in proc.stderr and "Traceback" not in proc.stderr
    assert "names no model_type" not in proc.stderr and not (tmp_path / "o").exists()


@pytest.mark.parametrize("kind, inputs", [
    ("unet", ["sample:float32[batch,4,height,width]", "timestep:float32[batch]",
              "encoder_hidden_states:float32[batch,text,16]"]),
    ("sd3", ["hidden_states:float32[batch,4,height,width]", "encoder_hidden_states:float32[batch,text,16]",
             "pooled_projections:float32[batch,8]", "timestep:float32[batch]"]),
    ("flux", ["hidden_states:float32[batch,image,8]", "encoder_hidden_states:float32[batch,text,16]",
              "pooled_projections:float32[batch,8]", "timestep:float32[batch]", "img_ids:float32[image,3]",
              "txt_ids:float32[text,3]", "guidance:float32[batch]"]),
    ("pixart", ["hidden_states:float32[batch,4,height,width]", "encoder_hidden_states:float32[batch,text,24]",
                "timestep:float32[batch]"]),
    ("unet2d", ["sample:float32[batch,3,height,width]", "timestep:float32[batch]"]),
    ("controlnet", ["sample:float32[batch,4,height,width]", "timestep:float32[batch]",
                    "encoder_hidden_states:float32[batch,text,16]", "controlnet_cond:float32[batch,3,64,64]"]),
])
def test_every_input_is_made_up_from_the_config(folders, kind, inputs):
    lm = load(f"hf:{folders / kind}")
    assert [str(s) for s in lm.inputs] == inputs
    assert lm.extra["library"] == "diffusers"


def test_sd3_sizes_keep_an_even_number_of_patches_and_say_so(folders):
    lm = load(f"hf:{folders / 'sd3'}")
    assert all(n % 4 == 0 for n in lm.dims["height"].sizes) and max(lm.dims["height"].sizes) <= 16
    assert any(d.code == "made-up-inputs" for d in lm.diagnostics)


def test_an_autoencoder_is_two_parts_and_a_pipeline_its_models(folders):
    assert [(p.name, p.keywords, p.main) for p in parts(f"hf:{folders / 'vae'}")] == [
        ("vae_encoder", {"part": "vae_encoder"}, False), ("vae_decoder", {"part": "vae_decoder"}, True)]
    assert [p.name for p in parts(f"hf:{folders / 'pipeline'}")] == [
        "text_encoder", "unet", "vae_encoder", "vae_decoder"]
    assert parts(f"hf:{folders / 'unet'}") == ()


def test_a_folder_naming_no_model_class_is_one_line(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({"_class_name": "os.system", "_diffusers_version": "0.30"}))
    with pytest.raises(SourceError, match="no diffusers model class"):
        load(f"hf:{tmp_path}")


def test_options_a_diffusers_folder_cannot_take_are_refused(folders, tmp_path):
    with pytest.raises(UsageError, match="--model-args"):
        api.export(f"hf:{folders / 'unet'}", tmp_path / "o", model_args={"x": 1})
    with pytest.raises(UsageError, match="--max-length"):
        api.export(f"hf:{folders / 'unet'}", tmp_path / "o", max_length=8)
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_unet_folder_is_exported_and_proven_through_the_cli(folders, tmp_path):
    out = tmp_path / "unet"
    proc = run_cli("export", f"hf:{folders / 'unet'}", "-o", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = load_report(out)
    assert rep["model"]["name"] == "UNet2DConditionModel" and (out / "model.onnx").is_file()
    assert {d["symbol"] for d in rep["check"]["dynamic_dims"]} >= {"batch", "height", "width", "text"}


def test_a_dim_is_cut_where_the_model_stops_running_and_said(folders):
    import diffusers
    import torch

    root = folders.parent / "aura"
    torch.manual_seed(0)
    diffusers.AuraFlowTransformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_mmdit_layers=1,
                                         num_single_dit_layers=1, attention_head_dim=8, num_attention_heads=2,
                                         joint_attention_dim=16, caption_projection_dim=16, out_channels=4,
                                         pos_embed_max_size=16).save_pretrained(str(root))
    lm = load(f"hf:{root}")  # 16 positions: 4x4 patches of 2, so a side of 8 at most
    assert lm.dims["height"].max == 8 and lm.dims["width"].max == 8
    assert any("fails at 12" in d.message for d in lm.diagnostics)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["flux", "sd3", "controlnet"])
def test_dit_transformers_are_proven(folders, tmp_path, kind):
    rep = api.export(f"hf:{folders / kind}", tmp_path / kind)
    assert rep["status"] == "ok", rep["summary"]


@pytest.fixture(scope="module")
def pipeline_out(folders, tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("sd") / "out"
    proc = run_cli("export", f"hf:{folders / 'pipeline'}", "-o", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stderr


@pytest.mark.slow
def test_a_pipeline_folder_is_every_model_proven_in_optimums_layout(pipeline_out):
    out, stderr = pipeline_out
    rep = load_report(out)
    assert [c["name"] for c in rep["components"]] == ["text_encoder", "unet", "vae_encoder", "vae_decoder"]
    assert all(c["status"] == "ok" for c in rep["components"])
    for c in rep["components"]:
        assert (out / c["file"]).is_file() and load_report(out / c["name"])["status"] == "ok"
    assert rep["model"]["name"] == "UNet2DConditionModel" and rep["export"]["path"] == "unet/model.onnx"
    assert "4/4 models proven" in stderr


@pytest.mark.slow
def test_the_pipeline_is_proven_end_to_end_by_denoising(pipeline_out):
    out, stderr = pipeline_out
    joint = load_report(out)["joint_proof"]
    assert joint["passed"] and joint["compared"] == "image" and joint["steps"] == 3
    assert joint["scheduler"] == "DDIMScheduler" and joint["max_abs_err"] < 1e-3 and joint["cosine"] > 0.9999
    assert joint["spread"] > 100 * joint["tolerance"]["atol"]  # an image that varies: the proof could fail
    assert "end-to-end: 3 DDIMScheduler steps" in stderr


@pytest.mark.slow
def test_the_end_to_end_proof_fails_on_a_slightly_wrong_unet(folders, pipeline_out, tmp_path):
    import shutil

    import numpy as np
    import onnx
    from onnx import numpy_helper

    from onnxport.core.options import Options
    from onnxport.diffusion import denoise

    out = tmp_path / "out"
    shutil.copytree(pipeline_out[0], out)
    model = onnx.load(str(out / "unet" / "model.onnx"))
    for i, init in enumerate(model.graph.initializer):  # the last conv: 2 % off, each step feeds the next
        if init.name.endswith("conv_out.weight"):
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(1.02),
                                                                        init.name))
    onnx.save(model, str(out / "unet" / "model.onnx"))
    source = f"hf:{folders / 'pipeline'}"
    proof = denoise.prove(source, out, parts(source), Options())
    assert proof is not None and not proof.passed and "outside" in (proof.why or "")


@pytest.mark.slow
@pytest.mark.parametrize("factor, kept", [(1.0, True), (3.0, False)])
def test_the_chosen_variants_are_judged_together_on_the_image(folders, pipeline_out, tmp_path, factor, kept):
    import json
    import shutil

    import numpy as np
    import onnx
    from onnx import numpy_helper

    from onnxport.core.options import Options
    from onnxport.diffusion import denoise

    out = tmp_path / "out"
    shutil.copytree(pipeline_out[0], out)
    model = onnx.load(str(out / "unet" / "model.onnx"))
    for i, init in enumerate(model.graph.initializer):  # a variant far off (3x) or exact (1x)
        if init.name.endswith("conv_out.weight"):
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(
                numpy_helper.to_array(init) * np.float32(factor), init.name))
    onnx.save(model, str(out / "unet" / "best.onnx"))
    rep = json.loads((out / "unet" / "report.json").read_text())
    rep["best"] = {"name": "fp16", "path": "best.onnx", "session_options": {"provider": "CPUExecutionProvider"}}
    (out / "unet" / "report.json").write_text(json.dumps(rep))
    source = f"hf:{folders / 'pipeline'}"
    proof = denoise.prove(source, out, parts(source), Options())
    assert proof is not None and proof.passed  # the exports themselves are right
    assert proof.best["variants"] == {"unet": "fp16"} and proof.best["passed"] is kept, proof.best
    assert ("together keep" in proof.summary) is kept


@pytest.mark.slow
def test_every_model_of_the_pipeline_is_served_over_kserve_v2(pipeline_out):
    import numpy as np
    import onnxruntime as ort
    import tritonclient.http as th

    from onnxport.serve import serve_app
    from tests.serve.test_grpc import serving

    out = pipeline_out[0]
    app = serve_app(out, max_batch=4, max_delay_ms=1)
    with serving(app) as (_, http, _grpc):
        client = th.InferenceServerClient(http)
        assert {m["name"] for m in client.get_model_repository_index()} == {
            "text_encoder", "unet", "vae_encoder", "vae_decoder"}
        rng = np.random.default_rng(0)
        feeds = {"latent_sample": rng.standard_normal((1, 4, 8, 8), dtype=np.float32)}
        inputs = []
        for name, value in feeds.items():
            inputs.append(th.InferInput(name, list(value.shape), "FP32"))
            inputs[-1].set_data_from_numpy(value)
        got = client.infer("vae_decoder", inputs).as_numpy("sample")
        want = ort.InferenceSession(str(out / "vae_decoder" / "model.onnx")).run(None, feeds)[0]
        assert got.shape == (1, 3, 16, 16) and np.allclose(got, want, atol=1e-5)


@pytest.mark.slow
def test_the_pipeline_is_one_triton_entry_per_model(pipeline_out, tmp_path):
    import json

    repo = tmp_path / "repo"
    proc = run_cli("triton", str(pipeline_out[0]), "--repo", str(repo), "--name", "sd", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    entries = json.loads(proc.stdout)
    assert [e["name"] for e in entries] == ["sd_text_encoder", "sd_unet", "sd_vae_encoder", "sd_vae_decoder"]
    for e in entries:
        assert (repo / e["name"] / "config.pbtxt").is_file() and (repo / e["name"] / "1" / "model.onnx").is_file()


@pytest.mark.parametrize("change, said", [
    ({"sample_size": "big"}, "sample_size = 'big' is not valid"),
    ({"sample_size": 10**9}, "sample_size = '1000000000' is not valid"),
    ({"block_out_channels": [160000, 320000]}, "parameters; the weights in"),
    ({"in_channels": -4}, "config.json does not build a UNet2DConditionModel"),
    ({"_class_name": "DiffusionPipeline"}, "no diffusers model class"),
])
def test_a_hostile_config_is_one_line_before_the_model_is_built(folders, tmp_path, change, said):
    import json
    import shutil

    folder = tmp_path / "unet"
    shutil.copytree(folders / "unet", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    proc = run_cli("export", f"hf:{folder}", "-o", str(tmp_path / "o"))
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "o").exists()


def test_a_folder_without_weights_is_one_line(folders, tmp_path):
    import shutil

    shutil.copytree(folders / "unet", tmp_path / "unet")
    for f in (tmp_path / "unet").glob("*.safetensors"):
        f.unlink()
    with pytest.raises(SourceError, match="holds no weights"):
        load(f"hf:{tmp_path / 'unet'}")


@pytest.mark.slow
def test_the_pipelines_report_pages_list_its_models(pipeline_out):
    out = pipeline_out[0]
    page = (out / "report.html").read_text(encoding="utf-8")
    md = (out / "report.md").read_text(encoding="utf-8")
    for name in ("text_encoder", "unet", "vae_encoder", "vae_decoder"):
        assert f'href="{name}/report.html"' in page and f"]({name}/report.md)" in md
    assert "end-to-end: 3 DDIMScheduler steps" in page and "**Together** ✅" in md
