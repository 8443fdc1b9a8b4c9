"""What the tests and the scripts in ``scripts/`` share:

- ``mounting``: real mounts made and always removed, daemons stopped by PID (safely);
- ``workload``: page content that identifies itself, and the probes tests make with it;
- ``scenarios``: crash storms, corruption, contention, bad input, a disk dying under a daemon;
- ``storm_worker``: one writer process of a storm (``python -m hicachefs.testing.storm_worker``);
- ``model``: the Hypothesis state machine run against a real mount (imports hypothesis);
- ``store_faults``: randomised device-fault and corruption rounds against the store alone;
- ``failing_disk``: ext4 on a loop device that fails on demand (root only);
- ``host_pools``: CPU doubles of SGLang's host pools (imports torch);
- ``engine``, ``glusterfs``, ``juicefs``, ``engines``: the shared tier's distributed filesystems,
  brought up and down by their scripts, behind one interface.

Never imported by the daemon.
"""
