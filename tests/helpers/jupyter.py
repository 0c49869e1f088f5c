"""Jupyter from the host: HTTP status codes, the REST API with a token, code run in a kernel over its websocket."""

import json
import urllib.error
import urllib.request
import uuid

import websocket

TOKEN = "test-token-" + uuid.uuid4().hex  # the token of conftest's `services` container


def base_url(container):
    return f"http://127.0.0.1:{container.host_port(8888)}"


def http_status(url, headers=None, method="GET", data=None):
    """The HTTP status of url, redirects followed; 0 when nothing answers."""
    request = urllib.request.Request(url, headers=headers or {}, method=method, data=data)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def jupyter_api(base, path, token, method="GET", body=None):
    """Call the Jupyter server at base (http://host:port[/prefix]) with a token; the JSON answer."""
    request = urllib.request.Request(
        base + path,
        method=method,
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        data=json.dumps(body).encode() if body is not None else None,
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


def api(container, path, token=TOKEN, method="GET", body=None):
    """jupyter_api on a container's published Jupyter port."""
    return jupyter_api(base_url(container), path, token, method, body)


def execute_request(code):
    """A Jupyter messaging protocol execute_request for code: (its msg_id, the message)."""
    msg_id = uuid.uuid4().hex
    return msg_id, {
        "header": {
            "msg_id": msg_id,
            "msg_type": "execute_request",
            "username": "test",
            "session": uuid.uuid4().hex,
            "version": "5.3",
        },
        "parent_header": {},
        "metadata": {},
        "channel": "shell",
        "content": {
            "code": code,
            "silent": False,
            "store_history": False,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        },
    }


def collect_output(conn, msg_id):
    """Read the kernel's messages for msg_id until it is idle: (stdout text, error names and values)."""
    stdout, errors = [], []
    while True:
        msg = json.loads(conn.recv())
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            stdout.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            errors.append(msg["content"]["ename"] + ": " + msg["content"]["evalue"])
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return "".join(stdout), errors


def execute_in_kernel(base, code, token, timeout=60):
    """Start a kernel on the Jupyter server at base, run code over the kernel websocket, return its
    stdout, delete the kernel."""
    kernel = jupyter_api(base, "/api/kernels", token, method="POST", body={"name": "python3"})
    url = "ws" + base.removeprefix("http") + f"/api/kernels/{kernel['id']}/channels"
    conn = websocket.create_connection(url, timeout=timeout, header=[f"Authorization: token {token}"])
    try:
        msg_id, request = execute_request(code)
        conn.send(json.dumps(request))
        stdout, errors = collect_output(conn, msg_id)
        assert not errors, errors
        return stdout
    finally:
        conn.close()
        jupyter_api(base, f"/api/kernels/{kernel['id']}", token, method="DELETE")


def execute(container, code, token=TOKEN, timeout=60):
    """execute_in_kernel on a container's published Jupyter port."""
    return execute_in_kernel(base_url(container), code, token, timeout)
