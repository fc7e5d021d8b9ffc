"""Analytics over the message log and the KPI log (DESIGN §9).

`kpi` and `scan` are pure (no Spark, no sockets); `job` is the PySpark job that spark-submit runs
and `report` writes the Markdown report with its charts. Nothing here imports the broker's
networking (zmq, kazoo, roq.transport).
"""
