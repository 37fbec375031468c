"""Kubernetes I/O: the API client, watches, Leases, the election, the status writes."""
