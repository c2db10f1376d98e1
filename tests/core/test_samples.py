"""Unit tests for onnxport.samples: the validation-case matrix and example inputs."""

from __future__ import annotations

import pytest
import torch

from onnxport.core.samples import Case, export_sizes, make_inputs, shape_of, shapes_for, validation_cases
from onnxport.core.spec import Dim, InputSpec, parse_input

BASE_LABELS = {"export", "min", "max", "odd", "edge values"}


def _mixed(cases: list[Case]) -> list[Case]:
    """The 'X=max, others min' cases (found by role, not by exact label wording)."""
    return [c for c in cases if c.label not in BASE_LABELS]


def _by_label(cases: list[Case]) -> dict[str, Case]:
    labels = [c.label for c in cases]
    assert len(labels) == len(set(labels)), labels
    return {c.label: c for c in cases}


# --------------------------------------------------------------------------- validation_cases


def test_validation_cases_single_dim():
    dims = {"batch": Dim("batch", 1, 64, 2)}
    cases = validation_cases(dims)
    by = _by_label(cases)
    assert [c.label for c in cases] == ["export", "min", "max", "odd", "edge values"]
    assert by["export"].sizes == {"batch": 2}
    assert by["export"].values == "random"
    assert by["min"].sizes == {"batch": 1}
    assert by["max"].sizes == {"batch": 64}
    assert by["odd"].sizes == {"batch": 9}          # odd, near sqrt(1 * 64)
    assert by["edge values"].sizes == {"batch": 2}
    assert by["edge values"].values == "edge"
    assert _mixed(cases) == []


def test_validation_cases_two_dims():
    dims = {"batch": Dim("batch", 1, 8, 2), "seq": Dim("seq", 4, 128, 16)}
    cases = validation_cases(dims)
    by = _by_label(cases)
    assert by["export"].sizes == {"batch": 2, "seq": 16}
    assert by["min"].sizes == {"batch": 1, "seq": 4}
    assert by["max"].sizes == {"batch": 8, "seq": 128}
    mixed = _mixed(cases)
    assert [c.sizes for c in mixed] == [{"batch": 8, "seq": 4}, {"batch": 1, "seq": 128}]
    assert "batch" in mixed[0].label and "seq" not in mixed[0].label
    assert "seq" in mixed[1].label and "batch" not in mixed[1].label
    assert all(c.values == "random" for c in mixed)
    odd = by["odd"].sizes
    assert set(odd) == {"batch", "seq"}
    for sym, size in odd.items():
        assert size % 2 == 1
        assert dims[sym].min <= size <= dims[sym].max
    assert odd["batch"] != odd["seq"]
    assert len(cases) == 7


def test_validation_cases_odd_sizes_distinct_for_same_range():
    dims = {s: Dim(s, 1, 64, None) for s in ("a", "b", "c")}
    odd = _by_label(validation_cases(dims))["odd"].sizes
    assert all(v % 2 == 1 and 1 <= v <= 64 for v in odd.values()), odd
    assert len(set(odd.values())) == 3, odd


def test_validation_cases_export_uses_min_without_example():
    dims = {"k": Dim("k", 3, 9, None)}
    assert export_sizes(dims) == {"k": 3}
    assert _by_label(validation_cases(dims))["export"].sizes == {"k": 3}


def test_validation_cases_no_duplicates():
    # min == export and max == odd-ish ranges: duplicates must be dropped, the first label kept.
    dims = {"batch": Dim("batch", 2, 3, 2)}
    cases = validation_cases(dims)
    keys = [(tuple(sorted(c.sizes.items())), c.values) for c in cases]
    assert len(keys) == len(set(keys))
    labels = [c.label for c in cases]
    assert "export" in labels and "min" not in labels          # min sizes == export sizes
    assert _by_label(cases)["max"].sizes == {"batch": 3}
    assert "odd" not in labels                                 # odd size 3 == max


def test_validation_cases_fixed_range_collapses():
    dims = {"n": Dim("n", 4, 4, 4)}
    cases = validation_cases(dims)
    assert [(c.label, c.sizes, c.values) for c in cases] == [
        ("export", {"n": 4}, "random"), ("edge values", {"n": 4}, "edge")]


def test_validation_cases_capped_by_max_cases():
    dims = {s: Dim(s, 1, 32, 2 + i) for i, s in enumerate("abcd")}
    full = validation_cases(dims, max_cases=100)
    assert len(full) == 9  # export, min, max, odd, edge, 4 mixed
    assert [c.sizes for c in _mixed(full)] == [
        {s: (32 if s == big else 1) for s in "abcd"} for big in "abcd"]
    assert [c.label for c in validation_cases(dims)] == [c.label for c in full[:8]]
    assert [c.label for c in validation_cases(dims, max_cases=3)] == ["export", "min", "max"]


def test_validation_cases_seeds_distinct():
    dims = {"batch": Dim("batch", 1, 8, 2), "seq": Dim("seq", 1, 64, 16)}
    seeds = [c.seed for c in validation_cases(dims)]
    assert len(seeds) == len(set(seeds))


def test_validation_cases_without_dims():
    cases = validation_cases({})
    assert [(c.label, c.sizes, c.values) for c in cases] == [
        ("export", {}, "random"), ("edge values", {}, "edge"), ("random values", {}, "random")]
    assert len({c.seed for c in cases}) == 3


# --------------------------------------------------------------------------- shapes


def test_shape_of_and_shapes_for():
    specs = (parse_input("ids:int64[batch,seq]"), parse_input("img:float32[batch,3,h,h]"))
    sizes = {"batch": 2, "seq": 7, "h": 5}
    assert shape_of(specs[0], sizes) == [2, 7]
    assert shapes_for(specs, sizes) == {"ids": [2, 7], "img": [2, 3, 5, 5]}


# --------------------------------------------------------------------------- make_inputs


SPECS = (
    parse_input("input_ids:int64[batch,seq]{5..20}"),
    parse_input("attention_mask:int64[batch,seq]"),
    parse_input("pixels:float32[batch,3,h]"),
    parse_input("half:float16[h]"),
    parse_input("flags:bool[batch,seq]"),
    parse_input("small:int32[seq]{-3..3}"),
    parse_input("plain:int64[batch]"),
    parse_input("u:uint8[4,seq]{0..255}"),
)
SIZES = {"batch": 4, "seq": 6, "h": 3}


@pytest.mark.parametrize("values", ["random", "edge"])
def test_make_inputs_shapes_and_dtypes(values):
    out = make_inputs(SPECS, SIZES, values, seed=0)
    assert len(out) == len(SPECS)
    assert [tuple(t.shape) for t in out] == [(4, 6), (4, 6), (4, 3, 3), (3,), (4, 6), (6,), (4,), (4, 6)]
    assert [t.dtype for t in out] == [torch.int64, torch.int64, torch.float32, torch.float16, torch.bool,
                                      torch.int32, torch.int64, torch.uint8]


@pytest.mark.parametrize("values", ["random", "edge"])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_make_inputs_integer_values_within_range(values, seed):
    ids, _, _, _, _, small, plain, u = make_inputs(SPECS, SIZES, values, seed=seed)
    assert 5 <= int(ids.min()) <= int(ids.max()) <= 20
    assert -3 <= int(small.min()) <= int(small.max()) <= 3
    assert 0 <= int(plain.min()) <= int(plain.max()) <= 9       # default range 0..9
    assert 0 <= int(u.min()) <= int(u.max()) <= 255


def test_make_inputs_edge_integers_hit_both_ends():
    ids, *_rest, u = make_inputs(SPECS, SIZES, "edge", seed=0)
    assert torch.equal(ids[0], torch.full((6,), 20))               # first row: repeated top token
    assert ids[-1].tolist() == [5, 20, 5, 20, 5, 20]               # last row: alternating lo / hi
    assert torch.equal(u[0], torch.full((6,), 255, dtype=torch.uint8))
    assert u[-1].tolist() == [0, 255, 0, 255, 0, 255]


def test_make_inputs_edge_integers_1d():
    (t,) = make_inputs((parse_input("t:int64[seq]{1..4}"),), {"seq": 5}, "edge")
    assert int(t[0]) == 4
    assert int(t[-1]) == 1
    assert 1 <= int(t.min()) <= int(t.max()) <= 4


def test_make_inputs_edge_floats():
    rand = make_inputs((parse_input("x:float32[batch,8]"),), {"batch": 3}, "random", seed=4)[0]
    edge = make_inputs((parse_input("x:float32[batch,8]"),), {"batch": 3}, "edge", seed=4)[0]
    assert torch.equal(edge[0], torch.zeros(8))
    assert torch.allclose(edge[1:], rand[1:] * 3.0)


def _rows(mask: torch.Tensor) -> list[list[int]]:
    return mask.to(torch.int64).tolist()


@pytest.mark.parametrize("values", ["random", "edge"])
def test_make_inputs_masks_are_binary(values):
    _, mask, _, _, flags, *_ = make_inputs(SPECS, SIZES, values, seed=3)
    assert set(mask.unique().tolist()) <= {0, 1}
    assert flags.dtype == torch.bool
    for m in (mask, flags):
        # attention-style: every row is one run of ones, padded before (left) or after (right) it
        for row in _rows(m):
            keep = sum(row)
            assert keep >= 1
            assert row in ([1] * keep + [0] * (len(row) - keep), [0] * (len(row) - keep) + [1] * keep)


def test_make_inputs_random_mask_rows_keep_at_least_one_token():
    _, mask, *_ = make_inputs(SPECS, {"batch": 8, "seq": 10, "h": 3}, "random", seed=5)
    rows = _rows(mask)
    assert rows[0] == [1] * 10
    assert all(sum(r) >= 1 for r in rows)


def test_make_inputs_mask_with_explicit_binary_range():
    (m,) = make_inputs((parse_input("attention_mask:int32[batch,seq]{0..1}"),), {"batch": 3, "seq": 4}, "edge")
    assert m.dtype == torch.int32
    assert _rows(m) == [[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 1]]


def test_make_inputs_mask_name_with_other_range_is_not_a_mask():
    (m,) = make_inputs((parse_input("mask_ids:int64[batch,seq]{10..12}"),), {"batch": 3, "seq": 40}, seed=0)
    assert 10 <= int(m.min()) <= int(m.max()) <= 12


def test_make_inputs_edge_mask_full_left_and_right_padded_rows_batch3():
    _, mask, _, _, flags, *_ = make_inputs(SPECS, {"batch": 3, "seq": 5, "h": 3}, "edge", seed=0)
    for m in (mask, flags):
        # full, right-padded to the first token, left-padded to the last: never a row that attends to nothing
        assert _rows(m) == [[1] * 5, [1, 0, 0, 0, 0], [0, 0, 0, 0, 1]]


def test_make_inputs_edge_mask_batch2_is_full_and_left_padded():
    (mask,) = make_inputs((parse_input("attention_mask:int64[batch,seq]"),), {"batch": 2, "seq": 5}, "edge")
    assert _rows(mask) == [[1] * 5, [0, 0, 0, 0, 1]]


def test_make_inputs_edge_mask_batch5_and_4d():
    (mask,) = make_inputs((parse_input("attention_mask:int64[batch,seq]"),), {"batch": 5, "seq": 6}, "edge")
    assert _rows(mask) == [[1] * 6, [1, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1], [1, 0, 0, 0, 0, 0],
                           [0, 0, 0, 0, 0, 1]]
    (m4,) = make_inputs((parse_input("attention_mask:int64[batch,1,1,seq]"),), {"batch": 3, "seq": 4}, "edge")
    assert m4.reshape(3, 4).tolist() == [[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 1]]


@pytest.mark.parametrize("values", ["random", "edge"])
@pytest.mark.parametrize(("batch", "seq"), [(1, 1), (2, 1), (3, 2), (8, 7)])
def test_make_inputs_no_mask_row_attends_to_nothing(values, batch, seq):
    (mask,) = make_inputs((parse_input("attention_mask:int64[batch,seq]"),), {"batch": batch, "seq": seq}, values)
    assert all(sum(r) >= 1 for r in _rows(mask))


def test_make_inputs_mask_1d_is_all_ones():
    (m,) = make_inputs((parse_input("attention_mask:int64[seq]"),), {"seq": 4}, "edge")
    assert m.tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize("values", ["random", "edge"])
def test_make_inputs_deterministic_for_same_seed(values):
    a = make_inputs(SPECS, SIZES, values, seed=11)
    b = make_inputs(SPECS, SIZES, values, seed=11)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_make_inputs_different_for_different_seeds():
    a = make_inputs(SPECS, SIZES, "random", seed=1)
    b = make_inputs(SPECS, SIZES, "random", seed=2)
    ids_a, _, px_a, *_ = a
    ids_b, _, px_b, *_ = b
    assert not torch.equal(ids_a, ids_b)
    assert not torch.equal(px_a, px_b)


def test_make_inputs_fixed_shape_and_scalar():
    specs = (InputSpec("s", "float32", ()), InputSpec("v", "int64", (3,), (2, 2)))
    s, v = make_inputs(specs, {}, "edge")
    assert s.shape == () and s.dtype == torch.float32
    assert v.tolist() == [2, 2, 2]


def test_make_inputs_zero_size_axis():
    specs = (parse_input("ids:int64[batch,seq]{0..3}"), parse_input("x:float32[batch,seq]"),
             parse_input("attention_mask:int64[batch,seq]"))
    ids, x, m = make_inputs(specs, {"batch": 0, "seq": 4}, "edge")
    assert ids.shape == (0, 4) and x.shape == (0, 4) and m.shape == (0, 4)
