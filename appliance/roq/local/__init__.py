"""`roq up`: a one-machine cluster with an embedded ZooKeeper, in the foreground."""
