"""locks.model's GGUF loading helper: one parse of the file for transformers' three reads."""
import numpy as np
import pytest

from locks import model

gguf = pytest.importorskip("gguf")


def _write_gguf(path, n):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(n)
    w.add_tensor("t", np.arange(4 * n, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_one_parse_shares_the_reader_of_that_file_only(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    _write_gguf(a, 2)
    _write_gguf(b, 3)
    cls = gguf.GGUFReader
    with model._one_gguf_parse(str(a)):
        r1 = gguf.GGUFReader(str(a))
        r2 = gguf.GGUFReader(str(tmp_path / "." / "a.gguf"))  # the same file by another spelling
        other = gguf.GGUFReader(str(b))
        assert r1 is r2
        assert other is not r1 and isinstance(other, cls)
        assert r1.fields["llama.block_count"].contents() == 2
        assert other.fields["llama.block_count"].contents() == 3
        assert np.array_equal(r1.tensors[0].data, np.arange(8, dtype=np.float32))
    assert gguf.GGUFReader is cls
    assert gguf.GGUFReader(str(a)) is not r1  # outside the block: a fresh parse


def test_the_reader_class_is_restored_when_the_block_raises(tmp_path):
    a = tmp_path / "a.gguf"
    _write_gguf(a, 1)
    cls = gguf.GGUFReader
    with pytest.raises(RuntimeError):
        with model._one_gguf_parse(str(a)):
            gguf.GGUFReader(str(a))
            raise RuntimeError("transformers failed")
    assert gguf.GGUFReader is cls
