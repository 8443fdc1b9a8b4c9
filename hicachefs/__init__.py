"""hicachefs: an L3 KV-cache store for SGLang, served as a FUSE filesystem.

Layers, outermost first: ``cli`` (command line) -> ``daemon`` (trio + pyfuse3 loop) ->
``fs.operations`` (FUSE translation only) -> ``fs.namespace`` / ``fs.control`` (POSIX
semantics, no pyfuse3) -> ``store`` (the tiered page store, no FUSE at all).
"""
