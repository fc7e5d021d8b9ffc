"""The GCM process (`roq gcm`): admin API, topology, config broadcast, provisioning."""
