"""The checkpoint reader (``trainer/safetensors_reader.py``): several threads read a checkpoint's
safetensors files in chunks and give back exactly what safetensors itself reads; a damaged
file, one cut short while it is read, a failing reader or Ctrl-C ends the read with one named
error (or the interrupt), the other readers stopped."""

from __future__ import annotations

import os
import pathlib
import re
import struct
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from remote_payload.trainer import safetensors_reader as SR  # noqa: E402
from remote_payload.trainer.config import TrainerConfigError  # noqa: E402

CPU = torch.device("cpu")


def _write(folder: pathlib.Path, shards: list[dict[str, torch.Tensor]]) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, tensors in enumerate(shards):
        safetensors_torch.save_file(tensors, str(folder / f"model-{i:05d}.safetensors"))
    return folder


def _same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return got.keys() == want.keys() and all(
        got[k].dtype == v.dtype and got[k].shape == v.shape and torch.equal(got[k], v)
        for k, v in want.items())


class TestWhatItReads:
    def test_reads_a_file_larger_than_one_chunk_in_order(self, tmp_path):
        tensors = {"a": torch.arange(3001, dtype=torch.float32), "b": torch.randn(7, 5).bfloat16()}
        _write(tmp_path, [tensors])
        assert _same(SR.load(tmp_path, CPU, chunk=1000), tensors)  # a tensor over 12 chunks

    def test_reads_every_shard_on_more_threads_than_chunks_and_counts_the_bytes(self, tmp_path):
        shards = [{"x.0": torch.randn(10, 10)}, {"x.1": torch.randn(3).double(),
                                                  "y": torch.arange(5)}]
        _write(tmp_path, shards)
        read: list[int] = []
        assert _same(SR.load(tmp_path, CPU, read=read, readers=16), shards[0] | shards[1])
        assert sorted(read) == sorted([400, 24 + 40])

    def test_reads_only_the_keys_asked_for_and_casts_floats_only(self, tmp_path):
        _write(tmp_path, [{"n": torch.arange(3), "w": torch.randn(4, 4), "z": torch.randn(1000)}])
        read: list[int] = []
        got = SR.load(tmp_path, CPU, torch.bfloat16, keys={"w", "n"}, read=read)
        assert set(got) == {"w", "n"} and got["w"].dtype == torch.bfloat16
        assert got["n"].dtype == torch.int64
        assert sum(read) == 24 + 64  # the span of the wanted tensors: not the one after them

    def test_a_shard_without_a_wanted_tensor_is_not_read(self, tmp_path):
        _write(tmp_path, [{"a": torch.ones(2)}, {"b": torch.ones(3)}])
        read: list[int] = []
        assert set(SR.load(tmp_path, CPU, keys={"b"}, read=read)) == {"b"}
        assert read == [12]


class TestWhenItFails:
    def test_names_a_folder_without_safetensors(self, tmp_path):
        with pytest.raises(TrainerConfigError, match=r"no \*\.safetensors"):
            SR.load(tmp_path, CPU)

    def test_names_a_file_cut_short_after_its_header_was_checked(self, tmp_path, monkeypatch):
        _write(tmp_path, [{"a": torch.randn(5000)}])
        f = next(tmp_path.glob("*.safetensors"))
        checked = SR.header

        def then_truncate(fd, path):
            out = checked(fd, path)
            os.truncate(path, path.stat().st_size - 4000)  # another writer cut it short
            return out

        monkeypatch.setattr(SR, "header", then_truncate)
        with pytest.raises(TrainerConfigError, match=f"{re.escape(str(f))}.*truncated while read"):
            SR.load(tmp_path, CPU)

    @pytest.mark.parametrize("stop", [KeyboardInterrupt(), TrainerConfigError("disk gone")],
                             ids=["ctrl-c", "error"])
    def test_a_reader_that_stops_stops_the_others(self, tmp_path, monkeypatch, stop):
        _write(tmp_path, [{"a": torch.randn(64 * 100)}])  # 400 chunks of 64 bytes, 4 readers
        calls, lock = [0], threading.Lock()
        real = SR._pread_full

        def failing(*args):
            with lock:
                calls[0] += 1
                n = calls[0]
            if n == 5:
                raise stop
            real(*args)
            time.sleep(0.002)  # scenario: a disk's pace: the failure is seen before the others read on

        monkeypatch.setattr(SR, "_pread_full", failing)
        with pytest.raises(type(stop)):
            SR.load(tmp_path, CPU, readers=4, chunk=64)
        assert calls[0] < 30  # of 400 chunks: the others took few (or no) more after the 5th

    def test_closes_every_file_it_opened_whatever_happens(self, tmp_path):
        _write(tmp_path, [{"a": torch.ones(2)}])
        (tmp_path / "z.safetensors").write_bytes(b"\xff" * 16)
        before = len(os.listdir("/proc/self/fd"))
        with pytest.raises(TrainerConfigError, match=r"z\.safetensors"):
            SR.load(tmp_path, CPU)
        assert len(os.listdir("/proc/self/fd")) == before


_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int8, torch.bool]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(_DTYPES), st.lists(st.integers(0, 9), max_size=3)),
                min_size=1, max_size=6),
       st.integers(1, 300), st.integers(1, 6), st.data())
def test_any_tensors_any_chunk_any_readers_read_back_as_safetensors_wrote_them(
        tmp_path_factory, specs, chunk, readers, data):
    tensors = {f"t{i}": torch.randint(0, 2, shape).to(dt) if dt == torch.bool
               else (torch.randn(shape) * 100).to(dt) for i, (dt, shape) in enumerate(specs)}
    keys = data.draw(st.sets(st.sampled_from(sorted(tensors))), label="keys")
    folder = _write(tmp_path_factory.mktemp("ckpt"), [tensors])
    got = SR.load(folder, CPU, keys=keys or None, readers=readers, chunk=chunk)
    assert _same(got, {k: v for k, v in tensors.items() if not keys or k in keys})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200), st.integers(0, 300))
def test_a_safetensors_header_of_any_bytes_is_read_or_named(tmp_path_factory, body, hlen):
    f = tmp_path_factory.mktemp("st") / "x.safetensors"
    f.write_bytes(struct.pack("<Q", hlen) + body)
    fd = os.open(f, os.O_RDONLY)
    try:
        n, header = SR.header(fd, f)
    except TrainerConfigError as e:
        assert str(f) in str(e) and "\n" not in str(e)
    else:
        assert n == hlen and isinstance(header, dict)
    finally:
        os.close(fd)
