"""hicachefs_client: SGLang's HiCache storage backend over a hicachefs mount (docs/contract.md, "The client").

Load it in SGLang with ``--hicache-storage-backend dynamic`` and the extra config
``{"backend_name": "hicachefs", "module_path": "hicachefs_client", "class_name": "HiCacheFS",
"interface_v1": 1, "mountpoint": "/mnt/hicache"}``. It knows only the contract, never the daemon.
"""

from .backend import HiCacheFS

__all__ = ["HiCacheFS"]
