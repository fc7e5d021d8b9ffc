"""roq: an elastic, persistent message queue.

Importing the package has no side effects; the processes live in their own packages
(`gcm`, `host`, `monitor`, `exchange`, and `local` for `roq up`) and the command line in `roq.cli`.
"""

__version__ = "0.1.0"
