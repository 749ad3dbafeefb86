"""Data: the bundled corpus, text and token files, the split, the windows, and bad input."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from lmperf.errors import SpecError
from lmperf.questions.train.corpus import DEFAULT_BYTES, generate
from lmperf.questions.train.data import (
    Batches, VAL_FRACTION, eval_windows, load_builtin, load_corpus, load_text, load_tokens,
    prepare_corpus,
)

# The golden curves depend on these exact bytes; a change to the generator must regenerate them.
BUILTIN_SHA256_PREFIX = "d03768f6"


def test_builtin_corpus_is_fixed_ascii_text():
    text = generate()
    assert len(text) == DEFAULT_BYTES and text == generate()
    assert hashlib.sha256(text).hexdigest()[:8] == BUILTIN_SHA256_PREFIX
    decoded = text.decode("ascii")
    assert "plus" in decoded and "After monday comes tuesday." in decoded
    assert generate(1000) == text[:1000]  # a shorter corpus is a prefix
    ids = load_builtin()
    assert ids.dtype == np.uint8 and ids.max() < 128


def test_builtin_source_splits_last_tenth_for_validation():
    ids, source, name = load_corpus()
    corpus = prepare_corpus(ids, source, name, context=64, vocab_size=256)
    assert (source, name) == ("builtin", "builtin")
    assert corpus.n_val == int(len(ids) * VAL_FRACTION)
    assert len(corpus.train) + len(corpus.val) == len(ids)
    assert np.array_equal(corpus.val, ids[-corpus.n_val:])
    assert corpus.describe()["val_tokens"] == corpus.n_val


def test_text_file_is_read_as_raw_bytes(tmp_path):
    path = tmp_path / "book.txt"
    text = "héllo wörld, " * 20  # non-ASCII: UTF-8 bytes above 127 are ids too
    path.write_text(text, encoding="utf-8")
    ids, source, name = load_corpus(data=path)
    assert source == "text" and name == str(path)
    assert bytes(np.asarray(ids)) == text.encode("utf-8")
    corpus = prepare_corpus(ids, source, name, context=16, vocab_size=256)
    assert corpus.max_id == max(text.encode("utf-8"))


def test_raw_uint16_token_file_is_memory_mapped(tmp_path):
    path = tmp_path / "tokens.bin"
    expected = (np.arange(5000) * 7 % 9999).astype(np.uint16)
    expected.tofile(path)
    ids = load_tokens(path)
    assert isinstance(ids, np.memmap) and ids.dtype == np.uint16
    assert np.array_equal(ids, expected)
    corpus = prepare_corpus(ids, "tokens", str(path), context=32, vocab_size=10_000)
    assert corpus.max_id == expected.max()


def test_npy_token_file_is_detected_by_its_magic(tmp_path):
    path = tmp_path / "tokens.npy"
    expected = np.arange(3000, dtype=np.uint16) % 500
    np.save(path, expected)
    ids, source, _ = load_corpus(tokens=path)
    assert source == "tokens" and np.array_equal(ids, expected)


def test_windows_are_consecutive_ids_from_their_split_only():
    ids = np.arange(10_000, dtype=np.int64) % 60_000  # id == position: windows show where they are
    corpus = prepare_corpus(ids.astype(np.uint16), "tokens", "t", context=8, vocab_size=60_000)
    inputs, targets = Batches(corpus.train, batch=64, context=8, seed=3).next()
    assert inputs.shape == targets.shape == (64, 8) and inputs.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets are the inputs shifted by one
    assert torch.all(inputs[:, 1:] - inputs[:, :-1] == 1)
    assert targets.max() < len(corpus.train)
    for vi, _ in eval_windows(corpus.val, batches=3, batch=16, context=8, seed=4):
        assert vi.min() >= len(corpus.train)


def test_same_seed_same_batches_other_seed_other_batches():
    ids = load_builtin(20_000)
    a, b, c = (Batches(ids, 4, 16, seed) for seed in (7, 7, 8))
    for _ in range(3):
        xa, xb, xc = a.next()[0], b.next()[0], c.next()[0]
        assert torch.equal(xa, xb) and not torch.equal(xa, xc)


def test_short_file_gets_one_validation_window(tmp_path):
    path = tmp_path / "short.txt"
    path.write_bytes(b"abcdefghij" * 5)  # 50 bytes, context 16: 10% would be 5 < 17
    corpus = prepare_corpus(load_text(path), "text", str(path), context=16, vocab_size=256)
    assert corpus.n_val == 17 and len(corpus.train) == 33


# --- bad input: one clear SpecError each ---------------------------------------------------------

def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("kind", ["data", "tokens"])
def test_missing_file(tmp_path, kind):
    with pytest.raises(SpecError) as exc:
        load_corpus(**{kind: tmp_path / "nope.bin"})
    assert "no such file" in _one_line(exc) and "nope.bin" in str(exc.value)


@pytest.mark.parametrize("kind", ["data", "tokens"])
def test_empty_file(tmp_path, kind):
    path = tmp_path / "empty.bin"
    path.write_bytes(b"")
    with pytest.raises(SpecError) as exc:
        load_corpus(**{kind: path})
    assert "is empty" in _one_line(exc)


def test_directory_is_not_a_data_file(tmp_path):
    with pytest.raises(SpecError, match="not a regular file"):
        load_corpus(data=tmp_path)


def test_token_id_beyond_vocabulary_names_the_id_and_position(tmp_path):
    path = tmp_path / "tokens.bin"
    ids = np.full(500, 3, dtype=np.uint16)
    ids[123], ids[400] = 10_004, 10_000
    ids.tofile(path)
    with pytest.raises(SpecError) as exc:
        prepare_corpus(load_tokens(path), "tokens", str(path), context=8, vocab_size=10_000)
    msg = _one_line(exc)
    assert "10004" in msg and "position 123" in msg and "10000 ids" in msg and "--vocab-size 10005" in msg


def test_text_needs_byte_vocabulary(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(bytes(range(200, 256)) * 10)
    with pytest.raises(SpecError, match="token id 255"):
        prepare_corpus(load_text(path), "text", str(path), context=8, vocab_size=128)


def test_raw_token_file_of_odd_length(tmp_path):
    path = tmp_path / "odd.bin"
    path.write_bytes(b"\x01\x00\x02")
    with pytest.raises(SpecError, match="not a whole number of uint16"):
        load_tokens(path)


def test_npy_that_is_not_a_flat_integer_array(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((4, 4), dtype=np.float32))
    with pytest.raises(SpecError, match="1-D integer array"):
        load_tokens(path)


def test_negative_ids_in_signed_npy(tmp_path):
    path = tmp_path / "neg.npy"
    np.save(path, np.array([1, 2, -5, 3] * 50, dtype=np.int32))
    with pytest.raises(SpecError, match="negative token id -5"):
        prepare_corpus(load_tokens(path), "tokens", str(path), context=4, vocab_size=100)


def test_file_too_short_for_the_context(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_bytes(b"x" * 100)
    with pytest.raises(SpecError) as exc:
        prepare_corpus(load_text(path), "text", str(path), context=64, vocab_size=256)
    msg = _one_line(exc)
    assert "100 tokens" in msg and "at least 130" in msg and "--context" in msg


def test_data_and_tokens_together(tmp_path):
    with pytest.raises(SpecError, match="not both"):
        load_corpus(data=tmp_path / "a", tokens=tmp_path / "b")
