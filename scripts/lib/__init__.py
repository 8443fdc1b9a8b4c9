"""What the scripts share, not entry points themselves: SGLang's calls as the benchmarks make
them (``bench_sglang``), the rank processes (``bench_rank``), the daemon's side of a run
(``bench_daemon``), the fast_file peer (``bench_fast_file``), the report and chart
(``bench_report``), and the demo's workload over SGLang's cache (``demo_workload``)."""
