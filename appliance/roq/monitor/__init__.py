"""The monitor process (`roq monitor`): one per queue; placement, liveness, scaling, KPIs."""
