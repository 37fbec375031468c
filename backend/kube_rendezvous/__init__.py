"""Kube-rendezvous backend."""
