"""The local backend (``graphrun run``): a job's machines as ``graphrun worker`` processes
on this host, optionally in network namespaces; and store processes outside a job."""
