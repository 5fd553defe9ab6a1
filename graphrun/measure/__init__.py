"""Cluster measurement: what hosts and the links between them can do."""
