"""The local backend: a job's machines as processes on this host."""
