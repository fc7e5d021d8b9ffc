"""The client library: `AdminClient` (queue lifecycle), `Publisher` and `Subscriber`."""
