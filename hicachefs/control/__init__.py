"""The files under ``.hicachefs/`` (docs/contract.md, "Control files"), over the POSIX layer's
errors, nodes and leases and the store's public API: ``files`` (what is there, stats, metrics,
config, the data plane's links) and one module per request stream: ``exists``, ``ingest``,
``fetch``, ``plane`` (the data plane's daemon side); ``request_limits`` shares out what their
requests may hold by user; ``lines`` parses their ``<size> <path>`` lines. A new control file is
a module here and a line in ``files`` (its docstring says where)."""
