"""Short runs of the randomised store rounds that ``scripts/stress.py`` runs by the thousand:
random device faults under random operations, and every kind of damage to the arena file."""

from __future__ import annotations

import pytest

from hicachefs_testing.store_faults import CORRUPTIONS, corruption_round, device_fault_round


def _report(figures) -> str:
    return "\n".join([str({k: v for k, v in vars(figures).items() if k != "examples"}), *figures.examples])


def test_random_device_faults_leave_the_store_consistent(tmp_path):
    figures = device_fault_round(tmp_path, seed=1, operations=800)
    assert figures.faults_injected >= 30 and figures.pages_checked >= 200, _report(figures)
    assert figures.inconsistencies == 0, _report(figures)
    assert figures.resurrected == 0, _report(figures)  # a delete the disk cannot record is refused


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_every_damage_to_the_arena_is_caught(tmp_path, kind):
    figures = corruption_round(tmp_path, seed=3, kind=kind)
    assert figures.corruptions_injected >= 1, _report(figures)
    assert figures.corruptions_caught == figures.corruptions_injected, _report(figures)
    assert figures.inconsistencies == 0 and figures.bystanders_lost == 0, _report(figures)
