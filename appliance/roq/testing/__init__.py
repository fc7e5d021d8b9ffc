"""Helpers for tests that start a real roq cluster on 127.0.0.1 (shipped, like kazoo.testing)."""
