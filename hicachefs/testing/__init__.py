"""What the tests and the benchmarks in ``scripts/`` share: real mounts made and always removed
(``mounting``), and CPU doubles of SGLang's host pools (``host_pools``, which imports torch).

Never imported by the daemon.
"""
