# `helm test`: are the CRDs established, and does the operator answer? Runs in the operator image
# under the operator's ServiceAccount (which may read CRDs and list Rendezvous objects). Outside a
# pod it uses $KUBECONFIG, which is how the repository's tests run this very script.
import os
import sys
import time
import urllib.request

from kubernetes import client, config

try:
    config.load_incluster_config()
except config.ConfigException:
    config.load_kube_config()

failures = []
extensions = client.ApiextensionsV1Api()
for crd in os.environ["CRD_NAMES"].split():
    try:
        status = extensions.read_custom_resource_definition(crd).status
    except client.ApiException as error:
        failures.append(f"CRD {crd}: {error.status} {error.reason}")
        continue
    conditions = (status.conditions if status is not None else None) or []
    if not any(c.type == "Established" and c.status == "True" for c in conditions):
        failures.append(f"CRD {crd} is not established")
    else:
        print(f"CRD {crd} is established")

url = os.environ.get("METRICS_URL", "")
if url:
    # Right after a rollout the Service may still route a moment to a replica that is going away (its
    # endpoints and the node's proxy rules follow within seconds): try again for up to 30 s.
    deadline = time.monotonic() + float(os.environ.get("METRICS_WAIT_SECONDS", "30"))
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                text = answer.read().decode()
            error = None
        except OSError as caught:
            error = caught
        if error is None or time.monotonic() > deadline:
            break
        print(f"{url}: {error}; trying again")
        time.sleep(2)
    if error is not None:
        failures.append(f"{url}: {error}")
    elif "kube_rendezvous_operator_write_conflicts_total" in text:
        print(f"{url} serves the operator's metrics")
    else:
        failures.append(f"{url} answered without the operator's metrics")
else:
    namespace = os.environ["WATCH_NAMESPACE"]
    try:
        client.CustomObjectsApi().list_namespaced_custom_object(
            "kube-rendezvous.io", "v1alpha1", namespace, "rendezvouses", limit=1
        )
        print(f"Rendezvous objects in {namespace} can be listed")
    except client.ApiException as error:
        failures.append(f"listing Rendezvous objects in {namespace}: {error.status} {error.reason}")

for failure in failures:
    print(f"FAILED: {failure}", file=sys.stderr)
sys.exit(1 if failures else 0)
