"""The message log (the thesis's Message Logging System). Standard library only: no sockets,
no ZooKeeper. `format` is the one place that packs and unpacks log bytes."""
