"""Nothing written to the API runs code in an agent; a per-job Role confines a job to its Rendezvous.

On the real API server, as the pods' ServiceAccount, read through tensorplay's own state holder
(the code that calls ``pickle.loads`` on whatever the backend hands it).
"""

from __future__ import annotations

import base64
import os
import pickle
import sys
import zlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from kube_rendezvous import create_backend
from kubernetes import client
from tensorplay.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousStateError
from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import (
    RendezvousSettings,
    RendezvousTimeout,
    _BackendRendezvousStateHolder,
    _NodeDesc,
    _RendezvousState,
)

from tests.helpers import REPO, create_rendezvous, rendezvous_parameters
from tests.testenv import ControlPlane, wait_until

GROUP, VERSION, PLURAL = "kube-rendezvous.io", "v1alpha1", "rendezvouses"


class RunsCommand:
    """Unpickling this runs ``touch <marker>``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def hostile_pickle(depth: int, marker: Path) -> bytes:
    """A frozenset holding ``depth`` nested ``_NodeDesc`` (hashing them recurses), then ``posix.system``.

    The shape of the 519-byte status that ran code through the first release's restricted
    unpickler: the nesting made its check fail with RecursionError, and the backend then
    handed the raw bytes on.
    """
    nested: Any = "x"
    for _ in range(depth):
        nested = _NodeDesc(nested, 0, 0)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20 * depth + 1000))
    try:
        return pickle.dumps((frozenset({nested}), RunsCommand(marker)), protocol=0)
    finally:
        sys.setrecursionlimit(limit)


FRAMINGS = {
    "raw": lambda data: data.decode("latin-1"),
    "base64": lambda data: base64.b64encode(data).decode("ascii"),
    "z1": lambda data: "z1:" + base64.b64encode(zlib.compress(data)).decode("ascii"),
    "kr1": lambda data: "kr1:" + base64.b64encode(zlib.compress(data)).decode("ascii"),
}


def holder_settings() -> RendezvousSettings:
    return RendezvousSettings(
        run_id="job-1",
        min_nodes=1,
        max_nodes=4,
        timeout=RendezvousTimeout(),
        keep_alive_interval=timedelta(seconds=5),
        keep_alive_max_attempt=3,
    )


def write_status(admin_api: client.ApiClient, namespace: str, name: str, status: dict[str, Any]) -> None:
    client.CustomObjectsApi(admin_api).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, {"status": status}, _content_type="application/merge-patch+json"
    )


class TestHostileStatus:
    @pytest.mark.parametrize("framing", ["raw", "base64", "z1"])
    def test_the_api_server_refuses_a_state_that_is_not_a_document(
        self, agent_kubeconfig: Path, admin_api: client.ApiClient, namespace: str, tmp_path: Path, framing: str
    ) -> None:
        backend, _ = create_backend(rendezvous_parameters(f"{namespace}/rdzv", agent_kubeconfig))
        backend.set_state(pickle.dumps(_RendezvousState()))
        payload = FRAMINGS[framing](hostile_pickle(490, tmp_path / "ran"))
        with pytest.raises(client.ApiException) as refused:
            write_status(admin_api, namespace, "rdzv", {"state": payload})
        assert refused.value.status == 422
        assert "status.state must be a kube-rendezvous state document" in refused.value.body

    @pytest.mark.usefixtures("first_release_crd")
    @pytest.mark.parametrize("framing", sorted(FRAMINGS))
    def test_the_hostile_pickle_family_is_refused_by_tensorplays_own_holder_and_never_runs(
        self, agent_kubeconfig: Path, admin_api: client.ApiClient, namespace: str, tmp_path: Path, framing: str
    ) -> None:
        backend, _ = create_backend(rendezvous_parameters(f"{namespace}/rdzv", agent_kubeconfig))
        backend.set_state(pickle.dumps(_RendezvousState()))
        refused = {}
        for depth in (0, 1, 100, 300, 480, 490, 500, 600, 700):
            marker = tmp_path / f"ran-{framing}-{depth}"
            payload = FRAMINGS[framing](hostile_pickle(depth, marker))
            write_status(admin_api, namespace, "rdzv", {"state": payload, "runId": "job-1"})
            holder = _BackendRendezvousStateHolder(backend, holder_settings(), cache_duration=0)
            with pytest.raises(RendezvousStateError, match=r"was refused, and nothing was changed: status\.state"):
                holder.sync()
            assert not marker.exists(), f"depth {depth} in framing {framing} ran its command"
            refused[depth] = len(payload)
        print(f"\n{framing}: refused depths and payload sizes {refused}")

    def test_a_valid_document_from_an_attacker_can_only_say_who_is_in_the_round(
        self, agent_kubeconfig: Path, admin_api: client.ApiClient, namespace: str
    ) -> None:
        from kube_rendezvous._rules.document import NodeId, RendezvousDocument, encode_document

        backend, _ = create_backend(rendezvous_parameters(f"{namespace}/rdzv", agent_kubeconfig))
        backend.set_state(pickle.dumps(_RendezvousState()))
        forged = RendezvousDocument(round=9, complete=True, participants={NodeId("intruder", 1, 0): 0})
        write_status(admin_api, namespace, "rdzv", {"state": encode_document(forged), "runId": "job-1"})
        holder = _BackendRendezvousStateHolder(backend, holder_settings(), cache_duration=0)
        holder.sync()
        state = holder.state
        assert type(state) is _RendezvousState and state.round == 9
        assert [type(node) for node in state.participants] == [_NodeDesc]


class TestPerJobRole:
    def test_a_job_bound_to_the_per_job_role_reaches_its_rendezvous_and_is_refused_another(
        self, control_plane: ControlPlane, admin_api: client.ApiClient, namespace: str, crds: None
    ) -> None:
        objects = client.CustomObjectsApi(admin_api)
        for name in ("llama-train", "other-job"):
            create_rendezvous(objects, namespace, name)
        control_plane.kubectl("-n", namespace, "apply", "-f", str(REPO / "examples" / "rbac-per-job.yaml"))
        kubeconfig = control_plane.serviceaccount_kubeconfig(namespace, "llama-train")
        own = wait_until(
            lambda: create_backend(rendezvous_parameters(f"{namespace}/llama-train", kubeconfig, create="false"))[0],
            30,
            "the per-job RoleBinding to take effect",
        )
        written = own.set_state(pickle.dumps(_RendezvousState()))
        assert written is not None and written[2] is True
        with pytest.raises(RendezvousConnectionError, match=r"403 Forbidden.*'get' on 'rendezvouses'"):
            create_backend(rendezvous_parameters(f"{namespace}/other-job", kubeconfig, create="false"))
        forbidden = control_plane.kubectl(
            "-n",
            namespace,
            "patch",
            "rdzv",
            "other-job",
            "--subresource=status",
            "--type=merge",
            "-p",
            '{"status":{"state":"kr1:x"}}',
            kubeconfig=kubeconfig,
            check=False,
        )
        assert forbidden.returncode != 0 and "forbidden" in forbidden.stderr.lower()
