"""The daemon process: the trio + pyfuse3 loop over the store, and what runs beside it.

``daemon`` opens the store, mounts and serves (``python -m hicachefs.daemon CONFIG_JSON
[PROGRESS_FD]``); ``config`` is what the command line hands it; ``recovery_reporter`` tells the
waiting command how rebuilding the disk index goes; ``sd_notify`` tells systemd the mount is
live; ``metrics`` renders the statistics for Prometheus, and ``metrics_endpoint`` serves them
over HTTP. Importing this package loads none of them.
"""
