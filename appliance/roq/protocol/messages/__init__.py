"""The schema of every BSON control message roq sends or receives, one module per channel.

    monitor   exchange reports (B+0), placement (B+1), notices to publishers (B+2) and
              subscribers (B+3), the rules the GCM pushes (B+4)
    control   a child's control port (PING/PONG with STATUS, SHUTDOWN, REPLICAS)
    host      the GCM's requests to a host (hcm.port) and their replies
    admin     the GCM's admin API (2000–2014), topology (2) and config broadcast (1500)
    kpi       the KPI stream (stat commands 11–40) and its latency histogram

One small frozen class per message, with `encode()` (a document for `bsonmsg.encode`) and
`decode(doc)` side by side. `decode` takes a document `bsonmsg.decode` returned (one frame, an
integer `CMD`) and checks every field it reads: a required field that is missing, a field of the
wrong type, a string or list past its bound or an integer out of range raises `DecodeError`
naming the field. Optional fields carry their default here, in the schema, and nowhere else.
Replies share `bsonmsg.Reply` (RESULT, COMMENT, ERROR, LEADER); a reply's own fields are read by
its schema once the envelope says OK. docs/protocol.md lists the same fields.
"""
