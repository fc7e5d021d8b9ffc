"""`roq http`: the HTTP gateway, the mq seed's API (v1) and more (v2) on roq's queues.

- `api.py`: the Starlette application (routes, request checks, v1 and v2 answers);
- `gateway.py`: what each call does, on ZooKeeper (coordination/topics.py) and the logs;
- `index.py`: the messages each topic keeps, read from the logs (owned by the event loop);
- `consumer.py`: the threads that read the logs into the index;
- `records.py`: a message as stored in a log record;
- `metrics.py`: `GET /metrics`;
- `service.py`: the process (uvicorn on a socket it binds itself).
"""
