"""What the tests, the bench (``scripts/``) and the demo share; not part of the wheel.

``scripts/setup.sh`` puts ``tests/support`` on the venv's path, so the suite, the scripts and
the processes they start (``python -m hicachefs_testing.<module>``) import it from the checkout.
The daemon and the client never import it.

Mounts and processes:
- ``mounting``: real mounts made and always removed, daemons stopped by PID (safely);
- ``storm_worker``, ``replacer``, ``latency_probe``: processes of their own (writers of a
  storm, a rank republishing pages, another client timing its requests);
- ``plain_user``, ``attacks``: what a plain user (uid 65534) runs against a mount, with the
  system's Python, and the tests' side of it.

Pages and scenarios:
- ``workload``: page content that identifies itself, and the probes tests make with it;
- ``scenarios``, ``mixed_load``: crash storms, corruption, contention, bad input, a disk dying;
- ``versions``, ``stress_clients``, ``plane_load``, ``replace_load``, ``fetch_limits``,
  ``pin_attacks``: the stress modes of the data plane and the hardening rounds (reads judged
  against the versions acknowledged before they began);
- ``model``: the Hypothesis state machine run against a real mount (imports hypothesis);
- ``store_faults``, ``faults``, ``store_tools``, ``failing_disk``: the store alone under device
  faults and corruption, and ext4 on a loop device that fails on demand (root only).

SGLang (import torch):
- ``host_pools``: CPU doubles of SGLang's host pools;
- ``sglang_cpu``, ``sglang_pools``, ``sglang_cache``, ``sglang_ranks``: SGLang 0.5.23's own radix
  cache and controller on the CPU, one rank or several processes;
- ``sglang_kv``, ``sglang_workload``, ``sglang_recorder``, ``sglang_metrics``, ``sglang_store``:
  the KV bytes and chat traffic, every storage call timed and checked, SGLang's metrics, and
  the page files each backend lays out.

The shared tier's engines: ``engine`` (the interface), ``glusterfs``, ``juicefs``, ``engines``.
"""
