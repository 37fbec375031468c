"""Kubernetes I/O: the API client, watches, Leases, the generic elector and the writer Lease, the status writes."""
