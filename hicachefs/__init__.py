"""hicachefs: an L3 KV-cache store for SGLang, served as a FUSE filesystem.

Layers, outermost first: ``cli`` (the command line: what a person or mount(8) runs) ->
``daemon`` (the daemon process: the trio + pyfuse3 loop, metrics, systemd) -> ``fs.operations``
(FUSE translation only) -> ``fs.namespace`` / ``fs.control`` (POSIX semantics, no pyfuse3) ->
``store`` (the tiered page store, no FUSE at all).
"""
