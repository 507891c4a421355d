"""The simulated GPUs refuse what a real GPU refuses: an allocation beyond the memory it has left."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "sim"))
import engine_double  # noqa: E402
import nvml_sim  # noqa: E402


@pytest.fixture
def sim(tmp_path):
    return nvml_sim.SimNvml(tmp_path / "nvml", gpus=nvml_sim.default_gpus(2))


def test_an_allocation_beyond_what_is_left_is_refused_and_nothing_is_recorded(sim):
    """vLLM's 0.92 of an H200 (132269 MiB) beside the 615 MiB the driver reserves leaves 10887 MiB: a job of 10500 fits,
    one of 20000 (the lab's old over-capacity case) is refused, and only on the GPU that is full."""
    sim.allocate(0, 132269, [os.getpid()])
    sim.allocate(0, 10500, [os.getpid()])
    before = sorted(path.name for path in (sim.root / "alloc").iterdir())
    with pytest.raises(nvml_sim.OutOfMemory, match="tried to allocate 20000 MiB on GPU 0, which has 143771 MiB in all and 387 MiB free"):
        sim.allocate(0, 20000, [os.getpid()])
    assert sorted(path.name for path in (sim.root / "alloc").iterdir()) == before
    sim.allocate(1, 20000, [os.getpid()])
    assert nvml_sim.used_mib(sim.root, 0) == (132269 + 10500 + 615, 143771)


def test_memory_of_a_dead_holder_is_free_again_and_a_leak_is_not(sim):
    holder = subprocess.Popen(["sleep", "60"])
    try:
        sim.allocate(0, 140000, [holder.pid])
        with pytest.raises(nvml_sim.OutOfMemory):
            sim.allocate(0, 5000, [os.getpid()])
    finally:
        holder.kill()
        holder.wait()
    sim.allocate(0, 140000, [os.getpid()])
    sim.allocate(1, 140000, [], leak=True)
    with pytest.raises(nvml_sim.OutOfMemory):
        sim.allocate(1, 5000, [os.getpid()])


def test_a_wake_takes_back_only_what_is_free(sim):
    parked = sim.allocate(0, 132269, [os.getpid()])
    nvml_sim.resize(parked, 600)
    sim.allocate(0, 20000, [os.getpid()])  # another user's job arrives while the engine is parked
    with pytest.raises(nvml_sim.OutOfMemory, match="GPU 0"):
        nvml_sim.resize(parked, 132269)
    assert "mib=600 " in parked.read_text()


def test_a_holder_process_refused_its_memory_exits_naming_it(sim):
    sim.allocate(0, 140000, [os.getpid()])
    done = subprocess.run([sys.executable, str(REPO / "tests" / "helpers" / "gpu_holder.py"), "job", "--sim-root", str(sim.root),
                           "--alloc", "0:8000"], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 1 and "CUDA out of memory: tried to allocate 8000 MiB on GPU 0" in done.stderr


@pytest.mark.parametrize(("total_mib", "tp", "speculative", "fraction"), [
    (143771, 1, False, 0.907),  # H200: 512 + 8192 x 1.5 + 256 x 2 + 128 = 13440 MiB reserved
    (143771, 8, False, 0.897),  # 512 + 12288 + 1024 + 1024 = 14848
    (143771, 1, True, 0.892),  # a drafter: 2 GiB more
    (40960, 1, False, 0.833),  # 512 + 6144 + 64 + 128, no 10 GiB floor under 60 GiB
])
def test_the_sglang_double_derives_its_default_share_as_sglang_does(total_mib, tp, speculative, fraction):
    assert engine_double.sglang_default_fraction(total_mib, tp, speculative) == fraction


def test_the_vllm_double_refuses_what_vllm_refuses_of_a_gguf(tmp_path):
    """A split part (vLLM loads single-file GGUF only), a file that is no GGUF, a tokenizer directory without tokenizer
    files - each read with the gguf package, the oracle; one whole GGUF with a tokenizer passes."""
    gguf = pytest.importorskip("gguf")
    np = pytest.importorskip("numpy")
    import types

    def write(path, split_max_tensors=0):
        writer = gguf.GGUFWriter(str(path), "llama", split_max_tensors=split_max_tensors)
        for index in range(4):
            writer.add_tensor(f"t{index}", np.arange(8, dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    (tmp_path / "split").mkdir()
    write(tmp_path / "split" / "m.gguf", split_max_tensors=2)
    write(tmp_path / "model.gguf")
    (tmp_path / "garbage.gguf").write_bytes(b"not a gguf at all" * 10)
    tokenizer, empty = tmp_path / "tok", tmp_path / "empty"
    tokenizer.mkdir()
    empty.mkdir()
    (tokenizer / "tokenizer.json").write_text("{}")

    def settings(model, tok=None):
        return types.SimpleNamespace(engine="vllm", model=str(model), tokenizer=str(tok) if tok else None)
    assert engine_double.gguf_refusal(settings(tmp_path / "model.gguf", tokenizer)) is None
    assert "split GGUF" in engine_double.gguf_refusal(settings(tmp_path / "split" / "m-00001-of-00002.gguf"))
    assert "is not a GGUF file vLLM can load" in engine_double.gguf_refusal(settings(tmp_path / "garbage.gguf"))
    assert "no tokenizer files" in engine_double.gguf_refusal(settings(tmp_path / "model.gguf", empty))


def test_every_process_can_read_every_allocation_whatever_its_umask(sim):
    """Engines run with UMask=0027 as their own users; the capacity check of one reads the others' allocations (the lab's
    first run with the check failed every SGLang start on vLLM's unreadable file)."""
    previous = os.umask(0o027)
    try:
        path = sim.allocate(0, 1000, [os.getpid()])
        nvml_sim.resize(path, 2000)
    finally:
        os.umask(previous)
    assert path.stat().st_mode & 0o777 == 0o644
    assert (sim.root / "alloc" / ".capacity.lock").stat().st_mode & 0o666 == 0o666
