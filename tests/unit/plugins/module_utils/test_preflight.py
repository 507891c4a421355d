"""The preflight's checks and the prewarm's plan as pure functions of what was observed."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils._engines import prewarm
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput
from ansible_collections.gpufleet.serving.plugins.module_utils._switch.preflight import (
    ModelListing,
    Request,
    check_compiler,
    check_disk,
    check_executable,
    check_fit,
    check_gpus,
    check_holders,
    check_model,
    check_port,
    listening_inodes,
)

PARAMS = {"engine": "vllm", "checks": ["executable", "model", "gpus", "port"], "version_argv": ["/usr/local/bin/vllm", "--version"],
          "version": None, "model": "/models/m", "draft_model": None, "user": "root", "gpus_needed": 8, "visible_devices": None,
          "port": 8000, "port_owners": ["vllm.service"], "install_dir": None, "install_min_free_mib": 1024, "nvml_timeout": 10,
          "version_timeout": 60}


def request(**changes) -> Request:
    return Request.from_params({**PARAMS, **changes})


def test_vllm_is_refused_without_the_compiler_it_needs_after_it_serves():
    """The real vLLM's failure (molecule/real_vllm): its CPU build served, then died on the answer check's first
    request with logprobs - torch.compile found no g++. Its CPU build needs g++; a GPU build, gcc or clang (Triton);
    SGLang is not checked."""
    missing = check_compiler("vllm", "0.32.0+cpu", {"g++": None})
    assert not missing.passed and missing.name == "compiler"
    assert "vllm 0.32.0+cpu needs g++ on its PATH" in missing.detail and "install g++ on the node" in missing.detail
    assert check_compiler("vllm", "0.32.0+cpu", {"g++": "/usr/bin/g++"}).passed
    headers = check_compiler("vllm", "0.32.0+cpu", {"g++": "/usr/bin/g++"}, ("/usr/include/python3.11/Python.h", False))
    assert not headers.passed and "include /usr/include/python3.11/Python.h, which is not there" in headers.detail
    assert "python3-dev" in headers.detail
    assert check_compiler("vllm", "0.32.0+cpu", {"g++": "/usr/bin/g++"}, ("/usr/include/python3.11/Python.h", True)).passed
    assert check_compiler("vllm", "0.33.0", {"gcc": None, "clang": "/usr/bin/clang"}).passed
    gpu = check_compiler("vllm", "0.33.0", {"gcc": None, "clang": None})
    assert not gpu.passed and "needs gcc or clang" in gpu.detail and "Triton" in gpu.detail
    assert check_compiler("sglang", "0.5.23", {}) is None


def test_the_compilers_are_looked_up_where_the_engine_runs_them(tmp_path):
    """Its executable's directory (a virtualenv's bin) first, then a service's default PATH."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._switch.preflight_node import NodeProbe

    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("vllm", "g++"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    found = NodeProbe(None).compilers(str(bin_dir / "vllm"), ("g++", "gpufleet-no-such-compiler"))
    assert found == {"g++": str(bin_dir / "g++"), "gpufleet-no-such-compiler": None}
    # the interpreter's own word on where its headers are, and whether they are there
    import sys
    import sysconfig
    where = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    assert NodeProbe(None).python_headers(sys.executable, 30) == (where, os.path.isfile(where))
    assert NodeProbe(None).python_headers(str(tmp_path / "no-python"), 30) is None


def test_bad_requests_are_refused_naming_the_option():
    with pytest.raises(InvalidInput, match="checks: unknown network"):
        request(checks=["network"])
    with pytest.raises(InvalidInput, match="version_argv"):
        request(version_argv=[])
    with pytest.raises(InvalidInput, match="gpus_needed"):
        request(gpus_needed=0)


def test_executable_and_pinned_version():
    assert check_executable(request(), 0, "INFO 12-01 import\n0.33.0\n").passed
    pinned = request(version="0.33.0")
    wrong = check_executable(pinned, 0, "0.32.1\n")
    assert not wrong.passed and wrong.detail == "/usr/local/bin/vllm --version reports 0.32.1, the pinned version is 0.33.0"
    assert check_executable(request(version="0.32.0"), 0, "0.32.0+cpu\n").passed, "a local build of the pin (vLLM's CPU build) is the pin"
    missing = check_executable(pinned, None, "/usr/local/bin/vllm does not exist")
    assert not missing.passed and "does not exist" in missing.detail
    crashed = check_executable(pinned, 1, "Traceback\nImportError: libcudart.so.12\n")
    assert crashed.detail.endswith("exited 1: ImportError: libcudart.so.12")


@pytest.mark.parametrize(("listing", "passed", "detail"), [
    (ModelListing("/m", "missing"), False, "model /m does not exist"),
    (ModelListing("/m", "unreadable"), False, "model /m cannot be read by vllm"),
    (ModelListing("/m", "directory", config=False, weights=[("a.safetensors", 1)]), False, "model /m has no config.json"),
    (ModelListing("/m", "directory", config=True), False, "model /m has no weight files"),
    (ModelListing("/m", "directory", config=True, weights=[("a.safetensors", 2**30)], unreadable=["b.safetensors"]), False,
     "model /m: vllm cannot read b.safetensors"),
    (ModelListing("/m", "file"), False, "model /m is a file, not a model directory"),
    (ModelListing("/m", "directory", config=True, weights=[("a.safetensors", 2**30), ("b.safetensors", 2**30)]), True,
     "model /m: 2 weight file(s), 2.00 GiB, readable by vllm"),
])
def test_model_directory(listing, passed, detail):
    check = check_model("model", listing, "vllm")
    assert check.passed is passed and check.detail.startswith(detail)


def test_a_hub_name_is_skipped_not_passed_silently():
    check = check_model("model", ModelListing("meta-llama/Llama-3.3-70B-Instruct", "hub"), "root")
    assert check.passed and check.skipped and "hub name" in check.detail


def test_gpus_fit_what_nvml_sees_or_what_the_unit_makes_visible():
    assert check_gpus(request(), 8).passed
    assert check_gpus(request(), 4).detail == "tensor x data parallel needs 8 GPU(s), 4 seen by NVML"
    assert check_gpus(request(gpus_needed=4, visible_devices="0,1,2,3"), 8).passed
    assert check_gpus(request(gpus_needed=4, visible_devices="0,1"), 8).detail == "tensor x data parallel needs 4 GPU(s), 2 visible (CUDA_VISIBLE_DEVICES)"
    assert "names 9" in check_gpus(request(gpus_needed=1, visible_devices="9"), 8).detail
    assert check_gpus(request(), None, "driver not loaded").detail == "NVML cannot be read: driver not loaded"


def test_port_free_held_by_the_engine_being_replaced_or_taken():
    assert check_port(request(), []).detail == "port 8000 is free"
    assert check_port(request(), [(10, "vllm.service")]).passed
    taken = check_port(request(), [(10, "vllm.service"), (77, "jupyter.service")])
    assert not taken.passed and "pid 77 (jupyter.service)" in taken.detail
    assert not check_port(request(), [(None, None)]).passed


def test_disk_room_for_an_install():
    assert check_disk(request(), 2 << 30, "/opt").passed
    assert check_disk(request(), 512 << 20, "/opt").detail == "/opt has 0.5 GiB free, the install needs 1.0 GiB"


def test_listening_sockets_are_read_from_proc_net_tcp():
    table = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
             "   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1\n"
             "   1: 0100007F:1F40 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2222 1\n"
             "   2: 00000000:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3333 1\n")
    assert listening_inodes(table, 8000) == {"1111"} and listening_inodes(table, 30000) == {"3333"}


def test_prewarm_plan_reads_only_what_fits_in_memory():
    files = [("/m/a.safetensors", 6 << 30), ("/m/b.safetensors", 6 << 30)]
    assert prewarm.plan(files, 64 << 30, 8 << 30).skipped is None
    skipped = prewarm.plan(files, 16 << 30, 8 << 30)
    assert skipped.skipped == "12.0 GiB of weights do not fit in the 16.0 GiB available minus the 8.0 GiB margin"
    assert prewarm.plan([], 64 << 30, 0).skipped.startswith("no local weight files")
    assert prewarm.available_bytes("MemTotal: 100 kB\nMemAvailable:   2048 kB\n") == 2 << 20


def test_prewarm_stops_at_its_time_limit(tmp_path):
    path = tmp_path / "a.safetensors"
    path.write_bytes(b"x" * (3 * prewarm.BLOCK))
    ticks = iter(range(100))
    done, _seconds, finished = prewarm.read_into_cache([(str(path), 3 * prewarm.BLOCK)], timeout=2, clock=lambda: next(ticks))
    assert not finished and done == prewarm.BLOCK, "one block per tick: the limit is checked before every read"
    done, _seconds, finished = prewarm.read_into_cache([(str(path), 3 * prewarm.BLOCK)], timeout=60)
    assert finished and done == 3 * prewarm.BLOCK


def gpus_beside(foreign_mib: dict[int, int], total_mib: int = 81559) -> list[dict]:
    return [{"index": index, "uuid": f"GPU-{index}", "total_mib": total_mib, "foreign_mib": foreign_mib.get(index, 0),
             "foreign_pids": [4242] if foreign_mib.get(index) else []} for index in range(8)]


def test_with_report_the_target_must_fit_beside_the_processes_left_running_on_each_of_its_gpus():
    """outside_units=report: another user's 8000 MiB on GPU 1 leaves 73559 MiB; vLLM's default 0.92 of 81559 MiB is
    75034 MiB: refused before the drain, with the figures. At 0.85 it fits; a job on a GPU the target does not use
    (visible devices 0,2) is no concern; fail and kill never ask."""
    refused = check_fit(request(outside_units="report", gpus_needed=2), gpus_beside({1: 8000}))
    assert not refused.passed and refused.name == "fit"
    assert ("GPU 1: vllm needs 0.92 (vLLM's default --gpu-memory-utilization) x 81559 = 75034 MiB, 8000 MiB held by pid(s) 4242 "
            "leave 73559 MiB") in refused.detail
    assert "Nothing was touched" in refused.detail
    assert check_fit(request(outside_units="report", gpus_needed=2, memory_fraction=0.85), gpus_beside({1: 8000})).passed
    assert check_fit(request(outside_units="report", gpus_needed=2, visible_devices="0,2"), gpus_beside({1: 8000})).passed
    assert check_fit(request(outside_units="fail"), gpus_beside({1: 8000})) is None
    assert check_fit(request(outside_units="report"), gpus_beside({})) is None
    with pytest.raises(InvalidInput, match="memory_fraction: must be more than 0 and at most 1, got 1.5"):
        request(memory_fraction=1.5)


def test_a_possible_holder_behind_a_blocked_read_fails_the_preflight_as_the_teardown_would():
    incomplete = ["1 process(es) may hold the GPUs (pid 5123 rsync of user alice in no unit: reading its open files blocked)"]
    check = check_holders(request(outside_units="report"), [], [], lambda holders: "", None, incomplete)
    assert not check.passed and "the scan for GPU holders is incomplete: 1 process(es) may hold the GPUs (pid 5123 rsync" in check.detail
    assert check_holders(request(outside_units="report"), [], [], lambda holders: "", None, []).passed


def test_a_holder_the_teardown_would_refuse_to_kill_alone_fails_the_preflight_naming_its_unit():
    """Decide before disrupting: with kill, a GPU holder that is the main process of a service systemd restarts would
    stop the cutover after the drain; the preflight names it first."""
    restarting = [{"pid": 77, "unit": "sidecar.service", "restart": "always"}]
    check = check_holders(request(outside_units="kill"), [], [], lambda holders: f"pid {holders[0]['pid']}", restarting)
    assert not check.passed and check.name == "holders"
    assert check.detail.startswith("GPU holders run as the main process of sidecar.service (Restart=always), which systemd would start again (pid 77)")
    assert "Nothing was touched" in check.detail
    assert check_holders(request(outside_units="kill"), [], [], lambda holders: "", []).passed


def test_sglang_at_its_own_default_is_judged_by_the_most_its_derivation_can_take():
    """SGLang without --mem-fraction-static derives its share at start and reserves at least 10 GiB on a GPU of more than
    60 GiB: on an H200 (143771 MiB) it takes at most 0.929. A job of 8000 MiB leaves room for that; 20000 MiB does not.
    On a 40 GiB GPU the floor is 3712 MiB (0.909)."""
    fits = check_fit(request(engine="sglang", outside_units="report", gpus_needed=8), gpus_beside({7: 8000}, total_mib=143771))
    assert fits.passed and not fits.skipped and "0.929 at most, by SGLang's own derivation at start" in fits.detail
    refused = check_fit(request(engine="sglang", outside_units="report", gpus_needed=8), gpus_beside({7: 20000}, total_mib=143771))
    assert not refused.passed
    assert ("GPU 7: sglang needs 0.929 (at most, by SGLang's own derivation at start) x 143771 = 133563 MiB, 20000 MiB held by "
            "pid(s) 4242 leave 123771 MiB") in refused.detail
    small = check_fit(request(engine="sglang", outside_units="report"), gpus_beside({0: 4000}, total_mib=40960))
    assert not small.passed and "0.909" in small.detail
    assert check_fit(request(engine="sglang", outside_units="report", memory_fraction=0.8), gpus_beside({0: 20000}, total_mib=143771)).passed


def test_with_report_the_way_back_must_fit_too_before_anything_is_touched():
    """The previous engine started again by a rollback meets the same holders: with a vLLM at 0.92 beside a 20000 MiB job
    the way back cannot fit even when the target (SGLang at 0.8) does, and the switch is refused with both engines' figures;
    a previous vLLM at 0.8 fits, and says so. The previous engine's own GPUs count (visible devices), not the target's."""
    beside = gpus_beside({7: 20000}, total_mib=143771)
    target = {"engine": "sglang", "outside_units": "report", "gpus_needed": 8, "memory_fraction": 0.8}
    refused = check_fit(request(**target, previous={"engine": "vllm", "gpus_needed": 8}), beside)
    assert not refused.passed
    assert "the way back cannot fit" in refused.detail and "vllm could not start again" in refused.detail
    assert "GPU 7: vllm needs 0.92 (vLLM's default --gpu-memory-utilization) x 143771 = 132269 MiB" in refused.detail
    assert "the target fits (0.8 as configured)" in refused.detail and "Nothing was touched" in refused.detail
    fits = check_fit(request(**target, previous={"engine": "vllm", "gpus_needed": 8, "memory_fraction": 0.8}), beside)
    assert fits.passed and "the way back fits (vllm at 0.8 as configured)" in fits.detail
    elsewhere = check_fit(request(**target, previous={"engine": "vllm", "gpus_needed": 4, "visible_devices": "0,1,2,3"}), beside)
    assert elsewhere.passed, "the previous engine does not use GPU 7"
    both = check_fit(request(engine="sglang", outside_units="report", gpus_needed=8, previous={"engine": "vllm", "gpus_needed": 8}), beside)
    assert not both.passed and "the target cannot fit" in both.detail and "the way back does not fit either: GPU 7: vllm needs" in both.detail
    in_place = request(engine="vllm", outside_units="report", previous={"engine": "vllm"})
    assert in_place.previous is None, "a change in place: the configuration it replaces is not known here"
    with pytest.raises(InvalidInput, match="previous.memory_fraction: must be more than 0 and at most 1, got 2"):
        request(engine="sglang", previous={"engine": "vllm", "memory_fraction": 2})


def test_a_tokenizer_directory_must_hold_a_tokenizer_file():
    from ansible_collections.gpufleet.serving.plugins.module_utils._switch.preflight import check_tokenizer

    good = check_tokenizer("tokenizer", ModelListing("/t", "directory", config=True, names=["config.json", "tokenizer.json"]), "vllm")
    assert good.passed
    empty = check_tokenizer("tokenizer", ModelListing("/t", "directory", config=True, names=["config.json"]), "vllm")
    assert not empty.passed and "no tokenizer file" in empty.detail
    assert not check_tokenizer("tokenizer", ModelListing("/t", "missing"), "vllm").passed
    staged = request(tokenizer="zai-org/GLM-5", tokenizer_dir="/m/zai-org--GLM-5--tokenizer")
    assert ("tokenizer", "zai-org/GLM-5") in staged.models and staged.staged["tokenizer"] == "/m/zai-org--GLM-5--tokenizer"


def test_a_gguf_model_needs_the_gguf_package_and_a_loader_in_the_engines_own_python():
    from ansible_collections.gpufleet.serving.plugins.module_utils._switch.preflight import check_gguf_loader

    assert check_gguf_loader("/opt/vllm/0.33.0/bin/python", {"gguf": True, "in_tree": True, "plugin": False}).passed
    assert check_gguf_loader("/p", {"gguf": True, "in_tree": False, "plugin": True}).passed, "out of tree: the plugin loads it"
    missing = check_gguf_loader("/p", {"gguf": False, "in_tree": False, "plugin": False})
    assert not missing.passed and "lacks gguf (vLLM's GGUF loader imports it) and vllm-gguf-plugin" in missing.detail
    unknown = check_gguf_loader("/p", None, "No such file")
    assert not unknown.passed and "could not be asked" in unknown.detail
