"""The host process (`roq host`): registers a machine, allocates ports, supervises children."""
