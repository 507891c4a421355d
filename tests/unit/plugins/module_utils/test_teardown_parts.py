"""The teardown's parts that every caller shares: its option set (_teardown/options.py) is what its doc fragment
promises, both ways; its longest run (_teardown/steps.py) is the one formula for the leases."""

from __future__ import annotations

import yaml

from ansible_collections.gpufleet.serving.plugins.doc_fragments.teardown import ModuleDocFragment
from ansible_collections.gpufleet.serving.plugins.module_utils._teardown.options import TEARDOWN_OPTIONS


def test_each_option_is_documented_with_its_type_choices_and_default():
    documented = yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["options"]
    assert sorted(documented) == sorted(TEARDOWN_OPTIONS)
    for name, spec in TEARDOWN_OPTIONS.items():
        doc = documented[name]
        assert (doc["type"], doc.get("elements"), doc.get("choices")) == (spec["type"], spec.get("elements"), spec.get("choices")), name
        assert doc.get("default") == spec.get("default"), f"{name}: documented default {doc.get('default')!r}, spec {spec.get('default')!r}"


def test_a_teardowns_longest_run_counts_each_units_stop_then_the_holders_and_the_memory():
    """The cleanup's lease and the switch's are sized by it: per unit its stop, its group's SIGKILL and 1 s of settle;
    then the holders' SIGTERM grace and SIGKILL wait (the module's own, else kill_timeout); then the memory poll."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._teardown.steps import longest_run

    assert longest_run(3, stop_timeout=7, kill_timeout=4, term_timeout=5, memory_timeout=11) == 3 * (7 + 4 + 1) + 5 + 4 + 11
    assert longest_run(3, 7, 4, 5, 11, holders_kill_timeout=13) == 3 * (7 + 4 + 1) + 5 + 13 + 11
    assert longest_run(1, 7, 4, 5, 11, holders_kill_timeout=0) == 7 + 4 + 1 + 5 + 0 + 11, "0 is a timeout, not 'none given'"
