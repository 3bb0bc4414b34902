import pickle

import numpy as np
import pytest
import torch

from core.protocol import Batch


def make(n=5):
    return Batch(
        {"input_ids": torch.arange(n * 3).view(n, 3), "scores": torch.arange(n, dtype=torch.float32) / 2,
         "h": (torch.arange(n * 2, dtype=torch.float32).view(n, 2) / 3).to(torch.bfloat16)},
        {"uid": [f"u{i}" for i in range(n)], "extra_info": [{"i": i} for i in range(n)],
         "ragged": [[0] * i for i in range(n)]},
        {"temperature": 1.0},
    )


def assert_same(a: Batch, b: Batch):
    assert sorted(a.keys()) == sorted(b.keys())
    for k in a.tensors:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    for k in a.non_tensors:
        assert list(a[k]) == list(b[k]), k
    assert a.meta == b.meta


def test_len_and_keys():
    b = make(4)
    assert len(b) == 4 and "uid" in b and "nope" not in b
    with pytest.raises(KeyError, match="nope"):
        b["nope"]
    with pytest.raises(ValueError, match="disagree"):
        Batch({"a": torch.zeros(3)}, {"s": ["x", "y"]})


def test_ragged_lists_stay_lists():
    b = Batch(non_tensors={"l": [[1, 2], [3, 4]]})  # equal lengths: must not become a 2-D array
    assert b["l"].shape == (2,) and b["l"][1] == [3, 4]


def test_setitem_checks_length():
    b = make(3)
    b["values"] = torch.ones(3, 7)
    assert b["values"].shape == (3, 7)
    with pytest.raises(ValueError, match="'bad' has 2 rows, the batch has 3"):
        b["bad"] = torch.ones(2)
    assert "bad" not in b


@pytest.mark.parametrize("n,parts", [(6, 2), (6, 3), (7, 7), (1, 1)])
def test_concat_of_chunk_is_identity(n, parts):
    b = make(n)
    assert_same(Batch.concat(b.chunk(parts)), b)


@pytest.mark.parametrize("n,parts", [(5, 2), (1, 4), (7, 3), (8, 4)])
def test_pad_chunk_unpad_roundtrip(n, parts):
    b = make(n)
    padded, pad = b.pad_to_multiple(parts)
    assert len(padded) % parts == 0 and pad == -n % parts
    # padding repeats rows from the start
    assert torch.equal(padded["input_ids"][n:], b["input_ids"][torch.arange(pad) % n])  # cyclic repeat
    chunks = padded.chunk(parts)
    assert all(len(c) == len(padded) // parts for c in chunks)
    assert_same(Batch.concat(chunks).unpad(pad), b)


def test_chunk_requires_divisor():
    with pytest.raises(ValueError, match="pad_to_multiple"):
        make(5).chunk(2)


def test_split_sizes():
    parts = make(7).split(3)
    assert [len(p) for p in parts] == [3, 3, 1]
    assert parts[2]["uid"].tolist() == ["u6"]


def test_repeat_interleaved_and_tiled():
    b = make(3)
    assert b.repeat(2)["uid"].tolist() == ["u0", "u0", "u1", "u1", "u2", "u2"]
    assert b.repeat(2, interleave=False)["scores"].tolist() == [0, 0.5, 1, 0, 0.5, 1]


def test_reorder_then_inverse_is_identity():
    b = make(6)
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(0))
    shuffled = b.reorder(perm)
    assert shuffled["uid"].tolist() == [f"u{i}" for i in perm.tolist()]
    assert_same(shuffled.reorder(torch.argsort(perm)), b)
    with pytest.raises(ValueError, match="permutation"):
        b.reorder([0, 0, 1, 2, 3, 4])


def test_bool_mask_index():
    b = make(4)
    assert b[torch.tensor([True, False, True, False])]["uid"].tolist() == ["u0", "u2"]


def test_select_and_union():
    b = make(3)
    left, right = b.select("input_ids", "uid"), b.select("scores", "uid")
    assert_same(left.union(right).union(b), b)
    other = b.select("scores").clone()
    other["scores"] = other["scores"] + 1
    with pytest.raises(ValueError, match="'scores'"):
        b.union(other)
    with pytest.raises(ValueError, match="meta key 'temperature'"):
        b.union(Batch({"z": torch.zeros(3)}, meta={"temperature": 0.5}))


def test_concat_needs_same_keys():
    with pytest.raises(ValueError, match="batch 1 has keys"):
        Batch.concat([make(2), make(2).select("uid")])


def test_minibatches_cover_each_row_once_per_epoch_and_are_seeded():
    b = make(10)
    mbs = list(b.minibatches(4, seed=3, epochs=2))
    assert [len(m) for m in mbs] == [4, 4, 2, 4, 4, 2]
    for epoch in (mbs[:3], mbs[3:]):
        assert sorted(torch.cat([m["scores"] for m in epoch]).tolist()) == sorted(b["scores"].tolist())
    again = list(b.minibatches(4, seed=3, epochs=2))
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(mbs, again))
    assert not torch.equal(mbs[0]["input_ids"], mbs[3]["input_ids"])  # a new shuffle each epoch


def test_pickle_roundtrip_keeps_dtypes_including_bf16():
    b = make(5)
    c = pickle.loads(pickle.dumps(b, protocol=5))
    assert_same(c, b)
    assert c["h"].dtype == torch.bfloat16


def test_pickle_is_out_of_band_for_tensor_bytes():
    """Tensor bytes travel as pickle-5 out-of-band buffers, which Ray maps without copying."""
    b = Batch({"x": torch.zeros(1 << 16)})
    buffers = []
    data = pickle.dumps(b, protocol=5, buffer_callback=buffers.append)
    assert len(data) < 4096 and sum(memoryview(x).nbytes for x in buffers) == 4 * (1 << 16)
    c = pickle.loads(data, buffers=buffers)
    assert torch.equal(c["x"], b["x"])


def test_clone_is_writable_and_independent():
    b = make(2)
    c = b.clone()
    c["scores"].add_(1)
    assert b["scores"].tolist() == [0.0, 0.5]
    assert isinstance(c["uid"], np.ndarray)
