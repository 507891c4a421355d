"""gpufleet.serving.report_files through ansible-playbook: the report and its page written on the controller as the
filters render them (the text to_nice_json gives, the page report_html gives), in check mode too, never reported as a
change; an earlier run's removed; a bad request refused naming the option."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import COLLECTIONS, REPO

DOCUMENT = {"schema_version": 1, "kind": "switch_engine", "target": "sglang", "hosts": {}, "summary": {"switched": 0}, "note": "héllo"}


def play(tmp_path, tasks: str, *extra: str) -> subprocess.CompletedProcess:
    playbook = tmp_path / "play.yml"
    (tmp_path / "document.json").write_text(json.dumps({"document": DOCUMENT}))
    playbook.write_text(f"- hosts: localhost\n  gather_facts: false\n  vars_files: ['{tmp_path}/document.json']\n  tasks:\n" + tasks)
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS), "ANSIBLE_PYTHON_INTERPRETER": sys.executable, "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default"}
    command = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook), *extra]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False)


def test_the_report_and_its_page_are_written_as_the_filters_render_them_and_removed(tmp_path):
    path = tmp_path / "reports" / "run" / "switch_engine.json"
    document = "'{{ document }}'"
    tasks = (f"    - gpufleet.serving.report_files: {{path: '{path}', document: {document}}}\n      register: written\n"
             f"    - ansible.builtin.copy: {{content: \"{{{{ document | to_nice_json }}}}\\n\", dest: '{tmp_path}/nice.json', mode: '0644'}}\n"
             f"    - ansible.builtin.copy: {{content: '{{{{ document | gpufleet.serving.report_html }}}}', dest: '{tmp_path}/page.html', mode: '0644'}}\n"
             "    - ansible.builtin.assert: {that: [written is not changed]}\n")
    run = play(tmp_path, tasks)
    assert run.returncode == 0, run.stdout + run.stderr
    assert path.read_text(encoding="utf-8") == (tmp_path / "nice.json").read_text(encoding="utf-8"), "the text to_nice_json gives"
    assert (path.parent / "switch_engine.html").read_text(encoding="utf-8") == (tmp_path / "page.html").read_text(encoding="utf-8")
    assert oct(path.stat().st_mode & 0o777) == "0o644" and not [name for name in os.listdir(path.parent) if name.startswith(".")]

    path.write_text("{}")
    run = play(tmp_path, f"    - gpufleet.serving.report_files: {{path: '{path}', document: {document}}}\n", "--check")
    assert run.returncode == 0 and json.loads(path.read_text())["target"] == "sglang", "a plan's report is written in check mode too"

    run = play(tmp_path, f"    - gpufleet.serving.report_files: {{path: '{path}', state: absent}}\n      register: gone\n"
                         "    - ansible.builtin.assert: {that: [gone.removed | length == 2, gone is not changed]}\n")
    assert run.returncode == 0, run.stdout + run.stderr
    assert os.listdir(path.parent) == []
    run = play(tmp_path, f"    - gpufleet.serving.report_files: {{path: '{path}', state: absent}}\n")
    assert run.returncode == 0, "nothing to remove is no error"


def test_a_bad_request_is_refused_naming_the_option(tmp_path):
    for args, named in [("{path: reports/x.json, document: {}}", "path: give the JSON report's absolute path"),
                        (f"{{path: '{tmp_path}/x.html', document: {{}}}}", "ending in .json"),
                        (f"{{path: '{tmp_path}/x.json'}}", "document: give the report as a mapping"),
                        (f"{{path: '{tmp_path}/x.json', state: gone}}", "state: 'gone' is not one of present, absent"),
                        ("{path: /proc/x/report.json, document: {}}", "/proc/x/report.json")]:
        run = play(tmp_path, f"    - gpufleet.serving.report_files: {args}\n")
        assert run.returncode != 0 and named in run.stdout, (args, run.stdout[-2000:])
