"""One long-lived ClientApp process per SuperNode: ``python -m fedge.deploy.node_process``.

By default a SuperNode starts a fresh ``flwr-clientapp`` process for every message, which imports torch
and fedge and builds the run again (10 to 20 s each on a 2-core machine, for a message whose training
takes a fraction of a second). A SuperNode started with ``--isolation process`` leaves its
ClientApp tasks to a process of one's own: this one takes them from the SuperNode's Runtime API one
after another and runs fedge's ClientApp in itself, so :mod:`fedge.deploy.client_app` keeps the built run
between the messages of a run (it caches it per run and partition). Each task is handled as
``flwr-clientapp`` handles it: its message and Flower context pulled, the ClientApp's reply (an error
reply if it raised) and the updated context pushed back, a heartbeat while it runs.

It serves fedge's app only (its ``fab_id`` is ``fedge/fedge-run``, :func:`fedge.deploy.launch.app_project`);
a task of another app gets an error reply.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import time

from flwr.app import Context, Message
from flwr.app.error import Error
from flwr.common.constant import ErrorCode, SubStatus
from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611
from flwr.supercore.app_utils import start_parent_process_monitor
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

from fedge.deploy import client_app

log = logging.getLogger("fedge.deploy")
FAB_ID = "fedge/fedge-run"
POLL_SECONDS = float(os.environ.get("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1"))  # as Flower's SuperExec


def _client(address: str, component: str, *interceptors: object) -> RuntimeHttpClient:
    """A client of the SuperNode's Runtime API on this host (plain HTTP on loopback, as Flower's own)."""
    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=True,
        root_certificates=None,
        interceptors=[RuntimeVersionHttpInterceptor(component_name=component), *interceptors],
        retry_invoker=make_simple_http_retry_invoker(),
    )


def run_task(address: str, token: str) -> None:
    """Pull the task of ``token`` (a message and its node's context), run fedge's ClientApp on it in
    this process, push the reply and the context back."""
    client = _client(address, "flwr-clientapp", RuntimeTokenHttpInterceptor(token))
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    heartbeat.start()
    message: Message | None = None
    context: Context | None = None
    reply: Message | None = None
    status, details = SubStatus.FAILED, "ClientApp task failed"
    began = time.perf_counter()
    try:
        message, context, run, _ = pull_task_input(client)
        if run.fab_id != FAB_ID:
            raise RuntimeError(f"this node runs fedge's ClientApp only, not {run.fab_id!r}")
        reply = client_app.app(message=message, context=context)
        status, details = SubStatus.COMPLETED, ""
        seconds = time.perf_counter() - began
        log.info("run %s: %s in %.2f s", run.run_id, message.metadata.message_type, seconds)
    except Exception as error:  # the node goes on; the server app gets an error reply, as from Flower's
        log.exception("the ClientApp raised")
        details = f"{type(error).__name__}: {error}"
        if message is not None:
            code = ErrorCode.CLIENT_APP_RAISED_EXCEPTION
            reply = Message(Error(code=code, reason=details), reply_to=message)
    finally:
        try:
            if reply is not None and context is not None:
                push_message(client, reply, context)
        finally:
            push_task_output(client, context, status, details)
            heartbeat.stop()
            client.close()


def serve(address: str, poll: float = POLL_SECONDS) -> None:
    """Take the SuperNode's ClientApp tasks one after another, for as long as this process lives."""
    client = _client(address, "SuperExec")
    request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP], agentapp_fab_hashes=[])
    while True:
        acquired = client.AcquireTask(request)
        if acquired.HasField("task") and acquired.token:
            run_task(address, acquired.token)
        else:
            time.sleep(poll)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime-api-address", required=True, help="the SuperNode's, host:port")
    parser.add_argument("--parent-pid", type=int, help="exit when this process (the SuperNode) exits")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per Runtime API request otherwise
    if args.parent_pid is not None:
        start_parent_process_monitor(args.parent_pid)
    with contextlib.suppress(KeyboardInterrupt):  # the SuperNode exited (the monitor's signal), Ctrl-C
        serve(args.runtime_api_address)


if __name__ == "__main__":
    main()
