"""The only package that imports kazoo: ZooKeeper sessions, the znode layout, typed records,
leader election with fencing. kazoo's exceptions become roq errors here."""
