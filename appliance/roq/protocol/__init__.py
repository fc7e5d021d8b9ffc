"""Bytes ⇄ typed messages. The standard library and pymongo's `bson` only: no sockets, no disk."""
