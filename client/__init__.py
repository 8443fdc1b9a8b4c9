"""hicachefs_client: SGLang's HiCache storage backend over a hicachefs mount (docs/contract.md, "The client").

Load it in SGLang with ``--hicache-storage-backend dynamic`` and the extra config
``{"backend_name": "hicachefs", "module_path": "hicachefs_client", "class_name": "HiCacheFS",
"interface_v1": 1, "mountpoint": "/mnt/hicache"}``. It knows only the contract, never the daemon.

``HiCacheFS`` is imported when first asked for (SGLang's loader asks with ``getattr``): it brings
torch and SGLang's types, some 4 s of a core, which a tool that only encodes the contract's
requests (``hicachefs_client.ingest``) does not need.
"""

__all__ = ["HiCacheFS"]


def __getattr__(name: str):
    if name == "HiCacheFS":
        from .backend import HiCacheFS

        return HiCacheFS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
