"""The download's wait: the jobs it waits for, and the progress line it prints for each."""

from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.action.job_wait import progress_line
from ansible_collections.gpufleet.serving.plugins.plugin_utils import _switch


def test_a_progress_line_says_the_bytes_done_of_the_total_and_the_rate():
    """Issue 42 (6): bytes done / total and a rate, not "FAILED - RETRYING ... (1452 retries left)"."""
    progress = {"bytes_done": 3 * 2**29, "bytes_total": 3 * 2**30, "rate_mib_s": 85.34}
    assert progress_line("lab/tiny-llama", progress, 12) == "lab/tiny-llama: 1.50 of 3.00 GiB (50 %), 85.3 MiB/s"
    assert progress_line("lab/tiny-llama", None, 12.4) == "lab/tiny-llama: running for 12 s (no figures yet)"
    assert progress_line("m", {"bytes_done": 0, "bytes_total": 2**30, "rate_mib_s": None}, 1) == "m: 0.00 of 1.00 GiB (0 %)"


def test_the_stage_jobs_name_each_download_and_its_progress_file():
    started = [{"ansible_job_id": "j1.1", "item": {"source": "lab/tiny-llama", "dest": "/var/lib/gpufleet-models/lab--tiny-llama/"}},
               {"skipped": True, "item": {"source": "lab/draft", "dest": "/x"}}]
    assert _switch.stage_jobs(started) == [{"jid": "j1.1", "label": "lab/tiny-llama",
                                            "progress": "/var/lib/gpufleet-models/lab--tiny-llama.progress"}]
