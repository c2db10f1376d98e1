"""--samples read into a SampleSet: arrays, texts and images, each checked against the model's inputs (no export)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from onnxport.api import load_model
from onnxport.core.errors import UsageError
from onnxport.prove import samples as proving
from onnxport.sources.datasets import read_samples
from tests.conftest import FIXTURES, MODELS
from tests.fixtures.samples import write_images

SAMPLES = FIXTURES / "samples.py"


@pytest.fixture(scope="module")
def two():
    return load_model(f"{SAMPLES}:TwoInputs", inputs=["x:float32[batch,4]", "ids:int64[batch,seq]"],
                      dims=["seq=2..6"])


@pytest.fixture(scope="module")
def bag():
    return load_model(f"{SAMPLES}:TokenBag", inputs=["input_ids:int64[batch,seq]", "attention_mask:int64[batch,seq]"],
                      dims=["seq=1..12"])


def test_named_arrays_become_rows_in_input_order(two, tmp_path):
    f = tmp_path / "s.npz"
    np.savez(f, ids=np.arange(30).reshape(10, 3) % 20, x=np.ones((10, 4), dtype=np.float64))
    s = read_samples(f, two)
    assert (s.kind, s.count, s.names) == ("arrays", 10, ("x", "ids"))
    assert s.rows[3][0].dtype == np.float32 and s.rows[3][1].tolist() == [9, 10, 11]
    assert s.where[3] == "sample 3"


@pytest.mark.parametrize("arrays,word", [
    ({"x": np.ones((3, 4), np.float32)}, "missing: ids"),
    ({"x": np.ones((3, 4), np.int64), "ids": np.zeros((3, 3), np.int64)}, "array 'x' is int64"),
    ({"x": np.ones((3, 5), np.float32), "ids": np.zeros((3, 3), np.int64)}, "axis 1 is 5, the model takes 4"),
    ({"x": np.ones((3, 4), np.float32), "ids": np.zeros((3, 9), np.int64)}, "('seq') is 9, outside the declared 2..6"),
    ({"x": np.ones((3, 4), np.float32), "ids": np.full((3, 3), 25)}, "sample 0: 'ids' holds 25"),
    ({"x": np.ones((3, 4), np.float32), "ids": np.zeros((4, 3), np.int64)}, "one leading sample axis"),
])
def test_bad_arrays_name_the_problem(two, tmp_path, arrays, word):
    f = tmp_path / "bad.npz"
    np.savez(f, **arrays)
    with pytest.raises(UsageError) as e:
        read_samples(f, two)
    assert word in e.value.message and str(f) in e.value.message and e.value.code == "samples-unreadable"


def test_texts_are_tokenized_and_padded_per_batch(bag, minilm_dir, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("Hello world.\n\nA somewhat longer sentence, to be cut at twelve tokens by the declared range.\n")
    s = read_samples(f, bag, tokenizer=minilm_dir)
    assert (s.kind, s.count, s.where) == ("text", 2, ("line 1", "line 3"))
    assert len(s.rows[0][0]) == 5 and len(s.rows[1][0]) == 12  # [CLS] hello world . [SEP]; truncated at seq max
    batch = proving.stack(bag, s, (0, 1))
    assert tuple(batch[0].shape) == (2, 12) and batch[1][0].tolist() == [1] * 5 + [0] * 7
    assert s.detail["max_length"] == 12 and s.pad == (0.0, 0.0)


def test_jsonl_pairs_and_their_errors(bag, minilm_dir, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"text": "Who?", "text_pair": "Me."}) + "\n")
    s = read_samples(f, bag, tokenizer=minilm_dir)
    assert s.detail["pairs"] == 1 and s.rows[0][0].tolist().count(102) == 2  # two [SEP]
    f.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"sentence": "no text"}) + "\n")
    with pytest.raises(UsageError, match="line 2 has no string field 'text'"):
        read_samples(f, bag, tokenizer=minilm_dir)
    f.write_text('{"text": "fine"}\n{"text": \n')
    with pytest.raises(UsageError, match="line 2 is not valid JSON"):
        read_samples(f, bag, tokenizer=minilm_dir)


def test_texts_need_a_tokenizer(bag, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("Hello\n")
    with pytest.raises(UsageError, match="brings no tokenizer") as e:
        read_samples(f, bag)
    assert "--tokenizer" in e.value.hint


def test_images_with_a_preprocess_function_and_a_broken_one(tmp_path):
    cnn = load_model(f"{SAMPLES}:TinyCNN", inputs=["image:float32[batch,3,32,32]"])
    write_images(tmp_path / "imgs", 5)
    (tmp_path / "imgs" / "notes.txt").write_text("not an image: left out")
    s = read_samples(tmp_path / "imgs", cnn, preprocess=f"{SAMPLES}:preprocess_tensor")
    assert (s.kind, s.count) == ("images", 5) and s.rows[0][0].shape == (3, 32, 32) and s.where[0] == "img00.png"
    with pytest.raises(UsageError, match="does not know how .* preprocesses images"):
        read_samples(tmp_path / "imgs", cnn)
    (tmp_path / "imgs" / "broken.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(UsageError, match="broken.png: Pillow cannot decode it"):
        read_samples(tmp_path / "imgs", cnn, preprocess=f"{SAMPLES}:preprocess")


def test_torchvision_images_get_the_weights_eval_transform(tmp_path):
    net = load_model("torchvision:resnet18", inputs=["image:float32[batch,3,224,224]"], dims=["batch=1..4"])
    write_images(tmp_path / "imgs", 3, size=80)
    s = read_samples(tmp_path / "imgs", net)
    assert s.rows[0][0].shape == (3, 224, 224) and s.detail["crop"] == [224] and s.detail["resize"] == [256]
    assert abs(float(s.rows[0][0].mean())) < 3  # normalized with the ImageNet mean and std


def test_timm_images_get_the_models_data_config(tmp_path):
    net = load_model("timm:resnet10t", dims=["batch=1..4"])
    write_images(tmp_path / "imgs", 2)
    s = read_samples(tmp_path / "imgs", net)
    assert s.rows[0][0].shape == (3, 176, 176) and s.detail["input_size"] == [3, 176, 176]


def test_batches_fill_up_to_a_declared_size_and_split_is_stable(two, tmp_path):
    f = tmp_path / "s.npz"
    np.savez(f, x=np.random.default_rng(0).normal(size=(11, 4)).astype(np.float32), ids=np.zeros((11, 3), np.int64))
    s = read_samples(f, two)
    refs = proving.references(two, s)
    assert refs.batch_size == 8 and [b.indices for b in refs.batches][1] == (8, 9, 10)
    fit, held = s.split(0.7)
    assert (fit.count, held.count) == (8, 3) and s.split(0.7)[1].where == held.where
    assert not set(fit.where) & set(held.where)
    with torch.inference_mode():
        assert refs.batches[0].outputs[0].shape == (8, 3)


def test_missing_file_and_unknown_kind(two, tmp_path):
    with pytest.raises(UsageError, match="not found"):
        read_samples(tmp_path / "nope.npz", two)
    (tmp_path / "a.csv").write_text("1,2")
    with pytest.raises(UsageError, match="unknown kind of file '.csv'"):
        read_samples(tmp_path / "a.csv", two)
    f = tmp_path / "one.npy"
    np.save(f, np.zeros((2, 4), np.float32))
    with pytest.raises(UsageError, match="a .npy holds one array, the model has 2 inputs"):
        read_samples(f, two)


def test_an_mlp_reads_a_npy(tmp_path):
    mlp = load_model(f"{MODELS}:TinyMLP", inputs=["x:float32[batch,8]"])
    f = tmp_path / "x.npy"
    np.save(f, np.zeros((4, 8)))
    s = read_samples(Path(f), mlp)
    assert s.count == 4 and s.rows[0][0].dtype == np.float32


def test_a_npz_with_very_many_arrays_is_named_in_a_short_line(two, tmp_path):
    f = tmp_path / "many.npz"
    np.savez(f, **{f"a{i}": np.zeros(1, np.float32) for i in range(20_001)})
    with pytest.raises(UsageError) as e:
        read_samples(f, two)
    assert "(20,001 in all)" in e.value.message and len(str(e.value)) < 600
