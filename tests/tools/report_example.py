"""A switch report of N nodes, made up but shaped as switch_engine.yml writes it: for the HTML page at fleet scale.

    python tests/tools/report_example.py 200 OUT.json [--html OUT.html]

Batches of one canary then 25 % of the fleet; each node drains, tears down, brings up and verifies in times that vary
from node to node; a few nodes fail in different ways (a rollback, a failed preflight, one unreachable) so that every
mark of the page shows. Deterministic (seeded): the same N gives the same document.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "collections"))

from ansible_collections.gpufleet.serving.plugins.plugin_utils import _html_report, _reports  # noqa: E402

T0 = 1796100000.0
GPUS = 8
ENGINE_MIB = 132269


def gpus(used: int) -> list[dict]:
    return [{"index": index, "uuid": f"GPU-{index:08x}-0000-0000-0000-000000000000", "used_mib": used, "clean": used <= 512} for index in range(GPUS)]


def worker(pid: int, gpu: int) -> dict:
    return {"pid": pid, "comm": "VLLM::Worker_TP" + str(gpu), "cmdline": f"python3 -m vllm.entrypoints worker {gpu}", "gpus": [gpu],
            "unit": "vllm.service"}


def host(rng: random.Random, start: float, fate: str, serial: int) -> dict:
    marks, t = [], start
    steps = [("lease", 0.8), ("discover", 1.5), ("preflight", 1.2), ("prewarm", rng.uniform(4, 9))]
    if fate != "preflight_failed":
        steps += [("leave_rotation", rng.uniform(1, 3)), ("drain", rng.uniform(2, 25)), ("teardown", rng.uniform(3, 12)),
                  ("bring_up", rng.uniform(40, 110))]
        steps += [("rollback", rng.uniform(30, 60))] if fate == "rolled_back" else [("verify", rng.uniform(1, 4))]
        steps += [("join_rotation", rng.uniform(1, 3)), ("boot", 0.5)]
    for phase, seconds in steps:
        marks.append({"phase": phase, "start": round(t, 3), "seconds": round(seconds, 3)})
        t += seconds
    report = _reports.not_reached_report("sglang", "")
    out = [m for m in marks if m["phase"] in ("leave_rotation", "join_rotation")]
    report.update({"result": fate, "from": "vllm", "to": "sglang", "engines_found": ["vllm"], "reason": None, "phases": marks,
                   "started": marks[0]["start"], "finished": round(t, 3),
                   "durations_s": {m["phase"]: m["seconds"] for m in marks}})
    if fate == "preflight_failed":
        report["reason"] = "model /models/Llama-3.3-70B-Instruct: sglang cannot read model-00003-of-00030.safetensors"
        return report
    report.update({"out_of_rotation": [out[0]["start"], out[-1]["start"] + out[-1]["seconds"]],
                   "downtime_s": round(out[-1]["start"] + out[-1]["seconds"] - out[0]["start"], 2),
                   "memory_before": gpus(ENGINE_MIB - rng.randint(0, 900)), "memory_after": gpus(0),
                   "terminated": [worker(40000 + serial * 10 + gpu, gpu) for gpu in range(GPUS - 1)],
                   "killed": [worker(40000 + serial * 10 + GPUS - 1, GPUS - 1)] if serial % 3 == 0 else []})
    if fate == "rolled_back":
        report.update({"failed_phase": "bring_up", "reason": "Ready | sglang.service did not serve within 300 s: still waiting for health"})
    return report


def document(count: int) -> dict:
    rng = random.Random(count)
    fates = {7: "rolled_back", 41: "preflight_failed", 123: "rolled_back"}
    batches = [1] + [max(1, count // 4)] * 8
    hosts, start, index = {}, T0 + 2, 0
    for size in batches:
        if index >= count:
            break
        ends = []
        for _slot in range(min(size, count - index)):
            name = f"gpu-{index + 1:03d}"
            report = host(rng, start + rng.uniform(0, 2), fates.get(index, "switched"), index)
            hosts[name] = report
            ends.append(report["finished"])
            index += 1
        start = max(ends) + 1
    hosts[f"gpu-{count:03d}"] = dict(hosts[f"gpu-{count:03d}"], result="unreachable", failed_phase="bring_up",
                                     reason="became unreachable during bring_up: Connection timed out")
    run = {"run_id": f"20261201T090000-example-{count}", "target": "sglang", "check_mode": False, "started": T0,
           "finished": start, "parameters": {"hosts": "gpu_nodes", "limit": None, "serial": [1, "25%"], "max_fail_percentage": 5}}
    return _reports.switch_run_report(hosts, run)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("nodes", type=int)
    parser.add_argument("json_out")
    parser.add_argument("--html")
    args = parser.parse_args(argv)
    made = document(args.nodes)
    Path(args.json_out).write_text(json.dumps(made, indent=1) + "\n")
    if args.html:
        Path(args.html).write_text(_html_report.page(made))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
