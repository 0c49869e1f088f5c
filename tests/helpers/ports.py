"""Host ports for the servers the tests start.

Where Docker publishes a port, Docker picks it: `-p 127.0.0.1::8888` (helpers.docker), host port 0
in a compose file, then `docker port` (Container.host_port). Nothing else can take it in between.

A server on this host that must be told its port in advance (an `ssh -L` forward, the registry,
JupyterHub and its proxy) gets reserved_port(). A bind-and-close probe is racy: the port is free
again the moment it is closed, and the next program asking the kernel for any free port may get
it. reserved_port() leaves the port in TIME_WAIT instead (a connection to it, closed from the
listening side first): for the next 60 s the kernel hands it to no one who asks for any port
(bind to port 0, an outgoing connection), while a server that binds exactly that port with
SO_REUSEADDR, as OpenSSH, Go, Node and Tornado servers all do, gets it at once. The window that
is left: another program that binds this exact port by number in those 60 s. For the same reason
it is also the port to use where a test needs one that nothing listens on (tests/static).
"""

import socket


def reserved_port(ip="127.0.0.1"):
    """A port on ip, held in TIME_WAIT for the server the test starts next (see the module's text)."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the TIME_WAIT side then allows reuse
        listener.bind((ip, 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        with socket.create_connection((ip, port), timeout=5):
            accepted, _ = listener.accept()
            accepted.close()  # the listening side closes first: (ip, port) is the end left in TIME_WAIT
    return port
