"""The FUSE adapter: the only package that imports pyfuse3. ``operations`` translates requests
to the request layer (``posix.requests``) and its answers back, ``kernel_notifier`` tells the
kernel what changed behind its back, ``session`` mounts, serves and unmounts. A new FUSE op is a
handler in ``operations`` over a call of ``posix.requests.Requests``."""
