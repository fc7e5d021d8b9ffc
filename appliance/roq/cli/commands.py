"""Imports every command module so that each registers its commands on `roq.cli.app.app`.

Each module owns its commands: daemons (gcm, host, up, monitor, exchange), queues (queue ...,
status), data (pub, sub, bench), logcmd (log ...), analytics, scaling (scaling ...),
keys (keys ...), metrics (metrics scrape-config, health), work (work, group ...), deadletters
(group dlq ...).
"""

from roq.cli import (  # noqa: F401
    analytics,
    daemons,
    data,
    deadletters,
    keys,
    logcmd,
    metrics,
    queues,
    requests,
    scaling,
    work,
)
