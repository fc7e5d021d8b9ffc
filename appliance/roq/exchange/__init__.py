"""The exchange process (`roq exchange`): the data plane, its log, replication, log reads."""
