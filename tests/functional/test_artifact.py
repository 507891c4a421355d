"""The collection as users get it: `ansible-galaxy collection build`, installed into an empty collections path, its
modules documented and its playbooks run by FQCN from that installed copy alone."""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
import re
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from conftest import REPO

BIN = Path(sys.executable).parent
# What the artifact may hold; anything else (a cache, a lab image, a test) fails the test by name.
ALLOWED = ["MANIFEST.json", "FILES.json", "README.md", "COPYING", "CHANGELOG.md", "meta/*.yml", "meta/ee-*.txt", "docs/*.md", "docs/images/*.png",
           "docs/images/*.svg",
           "docs/examples/*.html",
           "playbooks/*.yml", "playbooks/tasks/*.yml", "plugins/action/*.py", "plugins/doc_fragments/*.py", "plugins/filter/*.py", "plugins/module_utils/_*.py",
           "plugins/modules/*.py", "plugins/modules/*.yml", "plugins/plugin_utils/_*.py", "roles/*/defaults/main.yml", "roles/*/meta/*.yml",
           "roles/*/tasks/*.yml", "roles/*/vars/main.yml", "roles/*/templates/*.j2", "roles/*/README.md",
           "roles/monitoring/files/gpufleet-serving.rules.yml", "roles/monitoring/files/gpufleet-serving.json"]
REQUIRED = ["playbooks/switch_engine.yml", "playbooks/gpu_cleanup.yml", "playbooks/tasks/rollout_gate_stop.yml",
            "plugins/modules/gpu_holders_kill.py", "plugins/modules/gpu_holders_kill.yml",
            "roles/switch_engine/tasks/main.yml", "meta/runtime.yml", "docs/reports.md"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("artifact")
    build = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(work), str(REPO)],
                           capture_output=True, text=True, check=False)
    assert build.returncode == 0, build.stderr
    tarball = next(work.glob("gpufleet-serving-*.tar.gz"))
    with tarfile.open(tarball) as archive:
        files = sorted(member.name for member in archive.getmembers() if member.isfile())
    collections = work / "collections"
    # only the installed copy: no ansible.cfg of the checkout (run elsewhere), no in-place link
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_CONFIG=str(work / "none.cfg"), ANSIBLE_NOCOLOR="1")
    install = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", "--no-deps", "-p", str(collections), str(tarball)],
                             capture_output=True, text=True, env=env, cwd=work, check=False)
    assert install.returncode == 0 and (collections / "ansible_collections/gpufleet/serving/MANIFEST.json").exists(), install.stdout
    return {"files": files, "collections": collections, "env": env, "cwd": work}


def test_every_link_of_the_shipped_documents_reaches_a_file_that_ships(installed):
    """Issue 42 (13): the README linked a 200-node example page the artifact left out. Every relative link of a
    document that ships (README, docs, roles' READMEs) must name a file that ships too."""
    shipped = set(installed["files"])
    broken = []
    for document in (name for name in shipped if name.endswith(".md")):
        text = (REPO / document).read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+://|^#|^mailto:", target):
                continue
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(document), target.split("#", 1)[0]))
            if resolved not in shipped:
                broken.append(f"{document} -> {target}")
    assert broken == [], broken


def test_the_artifact_holds_only_allow_listed_files(installed):
    unexpected = [name for name in installed["files"] if not any(fnmatch.fnmatch(name, pattern) for pattern in ALLOWED)]
    assert unexpected == [], f"not allow-listed: {unexpected[:20]}"
    assert [name for name in REQUIRED if name not in installed["files"]] == []


def test_installed_modules_are_documented(installed):
    for module in ("gpu_holders_kill", "engine_preflight", "weights_prewarm", "display_text"):
        doc = subprocess.run([str(BIN / "ansible-doc"), "--json", f"gpufleet.serving.{module}"], capture_output=True, text=True,
                             env=installed["env"], cwd=installed["cwd"], check=False)
        assert doc.returncode == 0, doc.stderr
        found = json.loads(doc.stdout)[f"gpufleet.serving.{module}"]["doc"]
        assert found["filename"].startswith(str(installed["collections"])), "documented from the installed copy"
        assert found["options"], module


def test_playbooks_run_by_fqcn_from_the_installed_copy(installed):
    inventory = installed["cwd"] / "inventory.ini"
    # one node on a loopback port nothing listens on: every play runs, the node is recorded as not reached
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    inventory.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n\n[gpu_nodes]\n"
                         f"node1 ansible_host=127.0.0.1 ansible_port={port} ansible_ssh_common_args='-o ConnectTimeout=2'\n"
                         "\n[gpu_nodes:vars]\nvllm_model=/models/m\nsglang_model=/models/m\n")

    def playbook(*args):
        return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), *args], capture_output=True, text=True,
                              env=installed["env"], cwd=installed["cwd"], check=False)

    refused = playbook("gpufleet.serving.switch_engine", "-e", "target=trtllm")
    assert refused.returncode != 0 and "set the engine to switch to: -e target=vllm or -e target=sglang (got trtllm)" in refused.stdout
    # a node that cannot be reached: every play runs, the report is built and written by the installed filters
    lost = playbook("gpufleet.serving.switch_engine", "-e", "target=sglang")
    report = json.loads((installed["cwd"] / "reports" / "switch_engine.json").read_text())
    assert report["hosts"]["node1"]["result"] in ("unreachable", "not_reached"), lost.stdout[-2000:]
    # the table is printed as plain lines (gpufleet.serving.display_text), not as JSON-quoted strings
    assert re.search(r"\nhost +from +to +result +downtime s", lost.stdout), lost.stdout[-2000:]
    assert f"\nJSON report: {installed['cwd']}/reports/switch_engine.json\n" in lost.stdout
    cleanup = playbook("gpufleet.serving.gpu_cleanup", "--check")
    cleaned = json.loads((installed["cwd"] / "reports" / "gpu_cleanup.json").read_text())
    assert cleaned["hosts"]["node1"]["result"] == "not_reached", cleanup.stdout[-2000:]


def test_an_execution_environment_reads_the_collections_requirements(installed, tmp_path):
    """ansible-builder finds the controller's Python and system needs in the installed collection, and accepts an EE
    definition that installs the artifact (`create` writes the build context; building it needs a registry)."""
    introspect = subprocess.run([str(BIN / "ansible-builder"), "introspect", "--sanitize", str(installed["collections"])],
                                capture_output=True, text=True, check=False)
    assert introspect.returncode == 0, introspect.stderr
    found = yaml.safe_load(introspect.stdout)
    assert found["python"] == ["jinja2>=3.1  # from collection gpufleet.serving"]
    assert "openssh-client [platform:dpkg]  # from collection gpufleet.serving" in found["system"]
    tarball = next(installed["cwd"].glob("gpufleet-serving-*.tar.gz"))
    definition = tmp_path / "execution-environment.yml"
    definition.write_text(yaml.safe_dump({
        "version": 3, "images": {"base_image": {"name": "quay.io/fedora/fedora:41"}},
        "dependencies": {"ansible_core": {"package_pip": "ansible-core>=2.17,<2.20"}, "ansible_runner": {"package_pip": "ansible-runner"},
                         "galaxy": {"collections": [{"name": str(tarball), "type": "file"}, {"name": "community.general"}]}}}))
    create = subprocess.run([str(BIN / "ansible-builder"), "create", "-f", str(definition), "-c", str(tmp_path / "context")],
                            capture_output=True, text=True, check=False)
    assert create.returncode == 0, create.stdout + create.stderr
    assert "ansible-galaxy collection install" in (tmp_path / "context" / "Containerfile").read_text()
