"""kube-rendezvous operator: Kopf handlers for Rendezvous objects (not in the data path).

Run it with ``python -m kube_rendezvous_operator`` (see ``--help``) or
``kopf run -m kube_rendezvous_operator.handlers``.
"""
