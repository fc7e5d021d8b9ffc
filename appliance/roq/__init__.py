"""roq: an elastic, persistent message queue.

Importing the package has no side effects; the processes live in their own modules
(`gcm`, `host`, `monitor`, `exchange`) and the command line in `roq.cli`.
"""

__version__ = "0.1.0"
