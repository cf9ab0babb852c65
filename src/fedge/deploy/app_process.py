"""Long-lived app processes: ``python -m fedge.deploy.app_process clientapp|serverapp``.

By default Flower starts a fresh process for every task: a ``flwr-clientapp`` for every message a
SuperNode receives, a ``flwr-serverapp`` for every run. Each imports torch and fedge and builds the run
again (10 to 20 s on a 2-core machine), for a message whose training takes a fraction of a second. A
SuperNode or SuperLink started with ``--isolation process`` leaves its tasks to a process of one's own:
this one takes them from the Runtime API at ``--runtime-api-address`` one after another and runs fedge's
app in itself. A node's ClientApp then keeps the built run between the messages of a run
(:mod:`fedge.deploy.client_app` caches it per run and partition), and the server app starts each run
with torch and fedge already imported.

Each task is handled as Flower's own process handles it: its input pulled (the message and the node's
context, or the run and its config), the app run, the reply (an error reply if the ClientApp raised),
the context and the task's status pushed back, a heartbeat while it runs. It serves fedge's app only
(``fab_id`` ``fedge/fedge-run``, :func:`fedge.deploy.launch.app_project`); another app's task fails.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from flwr.app import Context, Message, RecordDict
from flwr.app.error import Error
from flwr.common.config import get_fused_config_from_fab
from flwr.common.constant import ErrorCode, SubStatus
from flwr.common.serde import context_from_proto, context_to_proto, fab_from_proto, run_from_proto
from flwr.proto.runtime_pb2 import (  # pylint: disable=E0611
    AcquireTaskRequest,
    PullTaskInputRequest,
    PushTaskOutputRequest,
)
from flwr.supercore.app_utils import start_parent_process_monitor
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.grid import HttpGrid
from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

log = logging.getLogger("fedge.deploy")
FAB_ID = "fedge/fedge-run"
POLL_SECONDS = float(os.environ.get("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1"))  # as Flower's SuperExec


def _client(address: str, ca: bytes | None, component: str, token: str | None = None) -> RuntimeHttpClient:
    """A client of the Runtime API on this host: over TLS checked against ``ca`` (a SuperLink with TLS
    serves it on its one port), else plain HTTP (a SuperNode's, on loopback)."""
    interceptors: list = [RuntimeVersionHttpInterceptor(component_name=component)]
    if token is not None:
        interceptors.append(RuntimeTokenHttpInterceptor(token))
    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=ca is None,
        root_certificates=ca,
        interceptors=interceptors,
        retry_invoker=make_simple_http_retry_invoker(),
    )


def _fedge_only(fab_id: str) -> None:
    if fab_id != FAB_ID:
        raise RuntimeError(f"this process runs fedge's apps only, not {fab_id!r}")


def run_clientapp(address: str, ca: bytes | None, token: str) -> None:
    """One message: pull it with its node's context, run fedge's ClientApp, push the reply and context."""
    from fedge.deploy import client_app

    client = _client(address, ca, "flwr-clientapp", token)
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    heartbeat.start()
    message: Message | None = None
    context: Context | None = None
    reply: Message | None = None
    status, details = SubStatus.FAILED, "ClientApp task failed"
    began = time.perf_counter()
    try:
        message, context, run, _ = pull_task_input(client)
        _fedge_only(run.fab_id)
        reply = client_app.app(message=message, context=context)
        status, details = SubStatus.COMPLETED, ""
        seconds = time.perf_counter() - began
        log.info("run %s: %s in %.2f s", run.run_id, message.metadata.message_type, seconds)
    except Exception as error:  # this process goes on; the server app gets an error reply, as from Flower's
        log.exception("the ClientApp raised")
        details = f"{type(error).__name__}: {error}"
        if message is not None:
            error_reply = Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details)
            reply = Message(error_reply, reply_to=message)
    finally:
        try:
            if reply is not None and context is not None:
                push_message(client, reply, context)
        finally:
            push_task_output(client, context, status, details)
            heartbeat.stop()
            client.close()


def run_serverapp(address: str, ca: bytes | None, token: str) -> None:
    """One run: pull it with its config, run fedge's ServerApp on a grid of the SuperLink, push the
    task's status (the run is completed or failed)."""
    from fedge.deploy import server_app

    client = _client(address, ca, "flwr-serverapp", token)
    grid = HttpGrid(runtime_api_address=address, insecure=ca is None, root_certificates=ca, token=token)
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    heartbeat.start()
    context: Context | None = None
    status, details = SubStatus.FAILED, "ServerApp task failed"
    began = time.perf_counter()
    try:
        task = client.PullTaskInput(PullTaskInputRequest())
        TaskIdentity.task_id, TaskIdentity.run_id = task.task_id, task.run.run_id  # the messages' origin
        TaskIdentity.node_id = task.context.node_id
        context, run = context_from_proto(task.context), run_from_proto(task.run)
        _fedge_only(run.fab_id)
        grid.set_run(run)
        context.run_config = get_fused_config_from_fab(fab_from_proto(task.fab).content, run)
        server_app.app(grid=grid, context=context)
        context.state = RecordDict()  # as Flower's ServerApp process: the final context goes back empty
        status, details = SubStatus.COMPLETED, ""
        log.info("run %s finished in %.1f s", run.run_id, time.perf_counter() - began)
    except Exception as error:  # this process goes on to the next run; this one is marked failed
        log.exception("the ServerApp raised")
        details = f"ServerApp failed with exception: {error}"
    finally:
        try:
            output = context_to_proto(context) if context is not None else None
            client.PushTaskOutput(PushTaskOutputRequest(context=output, sub_status=status, details=details))
        finally:
            heartbeat.stop()
            grid.close()
            client.close()


TASKS: dict[str, tuple[TaskType, Callable[[str, bytes | None, str], None], str]] = {
    "clientapp": (TaskType.CLIENT_APP, run_clientapp, "fedge.deploy.client_app"),
    "serverapp": (TaskType.SERVER_APP, run_serverapp, "fedge.deploy.server_app"),
}
"""Each kind: the task type it takes, how it runs one, and the app's module (imported before the first)."""


def serve(kind: str, address: str, ca: bytes | None = None, poll: float = POLL_SECONDS) -> None:
    """Take the Runtime API's tasks of ``kind`` one after another, for as long as this process lives
    (``ca``: the Runtime API is served over TLS with a certificate of this CA)."""
    task_type, run_task, module = TASKS[kind]
    importlib.import_module(module)  # torch and fedge: while the federation starts, not in the first task
    client = _client(address, ca, "SuperExec")
    request = AcquireTaskRequest(supported_task_types=[task_type], agentapp_fab_hashes=[])
    while True:
        acquired = client.AcquireTask(request)
        if acquired.HasField("task") and acquired.token:
            run_task(address, ca, acquired.token)
        else:
            time.sleep(poll)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=sorted(TASKS), help="SuperNode: clientapp; SuperLink: serverapp")
    parser.add_argument("--runtime-api-address", required=True, help="host:port of the Runtime API it serves")
    parser.add_argument("--parent-pid", type=int, help="exit when this process (SuperNode, SuperLink) exits")
    parser.add_argument("--root-certificates", type=Path, help="CA certificate of a Runtime API with TLS")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per Runtime API request otherwise
    if args.parent_pid is not None:
        start_parent_process_monitor(args.parent_pid)
    with contextlib.suppress(KeyboardInterrupt):  # the parent exited (the monitor's signal), Ctrl-C
        ca = args.root_certificates.read_bytes() if args.root_certificates else None
        serve(args.kind, args.runtime_api_address, ca)


if __name__ == "__main__":
    main()
