"""hicachefs: an L3 KV-cache store for SGLang, served as a FUSE filesystem.

Layers, outermost first (each imports only those below it): ``cli`` (the command line: what a
person or mount(8) runs) -> ``daemon`` (the daemon process: the trio loop, metrics, systemd) ->
``fuse`` (the one package that imports pyfuse3: FUSE operations translated to requests) ->
``control`` (the batched control files: exists, ingest, fetch, the data plane) -> ``posix``
(names, inodes, handles, publishing: POSIX semantics) -> ``store`` (the tiered page store, no
FUSE at all). The client (``hicachefs_client``, in ``client/``) knows only the contract,
docs/contract.md.
"""
