"""What the mount means, without FUSE (docs/contract.md, "Namespace" and "Page files").

``requests`` is the request layer: every FUSE request as a plain call (the FUSE adapter,
``fuse.operations``, calls it), blocking I/O run in a thread, every refusal given its errno,
counted and logged in one place (``refusal_log``). ``namespace`` decides what each request means,
over its parts: the directories (``tree``), the inodes the kernel holds for pages (``inodes``:
one per version of a page), files being written and the rules that publish them
(``publishing``, ``nodes``), open files (``handles``, ``page_handle``: pins on a lease), listings
(``listing``), opens that raced a replace (``racing_opens``). It names only the store's public
API, and reaches the files under ``.hicachefs`` through ``namespace.ControlFiles`` (``control/``,
which may import this package, never the other way). Not thread-safe: the trio thread only.
"""
