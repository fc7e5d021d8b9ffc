"""Imports every command module so that each registers its commands on `roq.cli.app.app`.

Each module owns its commands: daemons (gcm, host, up), queues (queue ..., status), data
(monitor, exchange, pub, sub, bench), logcmd (log ...), analytics.
"""

from roq.cli import analytics, daemons, data, logcmd, queues  # noqa: F401
