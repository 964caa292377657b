"""The informers' watches against a real kube-apiserver: a watch the server ends at its
``timeoutSeconds`` (every 5-10 minutes in production) is followed by a new watch from the last
resourceVersion — no error, no relist — with either request transport."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from scheduler.kube.cluster import NODES_PATH, node_spec
from scheduler.kube.credentials import load_credentials
from scheduler.kube.http11 import Http11Transport
from scheduler.kube.informer import Informer
from scheduler.kube.rest import RestClient
from scheduler.kube.transport import Transport, Urllib3Transport

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("transport_kind", ["http11", "urllib3"])
def test_a_watch_ended_by_its_timeout_is_watched_again_without_a_relist(
    apiserver: ApiServer, transport_kind: str
) -> None:
    creds = load_credentials(apiserver.kubeconfig_path())
    transport: Transport = (
        Http11Transport(creds) if transport_kind == "http11" else Urllib3Transport(creds)
    )
    rest = RestClient(transport, token=creds.token)
    informer = Informer(rest, node_spec(), watch_timeout=(1, 1))
    informer.start()
    name = f"watch-timeout-{transport_kind}"
    try:
        assert informer.wait_for_sync(30)
        time.sleep(3.5)  # the server ends about three one-second watches meanwhile
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        rest.request("POST", NODES_PATH, body=node)
        deadline = time.monotonic() + 20
        while name not in {n.name for n in informer.items()} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert name in {n.name for n in informer.items()}, "the informer stopped watching"
        # Closing a stream the server had ended raised (urllib3 >= 2.3's shutdown() of a
        # connection already back in its pool): an "informer error", unhealthy, a relist.
        assert (informer.relists, informer.healthy, informer.last_error) == (1, True, "")
    finally:
        informer.stop()
        rest.request("DELETE", f"{NODES_PATH}/{name}")
        transport.close()
