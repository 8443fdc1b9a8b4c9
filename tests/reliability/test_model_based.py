"""The Hypothesis state machine of ``hicachefs_testing.model`` against a real mount: random
namespace and page operations, eviction pressure and remounts agree with a small model.
``scripts/stress.py`` runs the same machine for tens of thousands of steps."""

from __future__ import annotations

import os

from hicachefs_testing.model import MountModel, model_settings

MountModel.TestCase.settings = model_settings(
    examples=int(os.environ.get("HICACHEFS_MODEL_EXAMPLES", "5")),
    steps=int(os.environ.get("HICACHEFS_MODEL_STEPS", "25")),
    derandomize=os.environ.get("HICACHEFS_MODEL_RANDOM") is None,
)
TestMountModel = MountModel.TestCase
