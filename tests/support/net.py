"""Free ports for the servers the tests start."""

import random
import socket

# Picked below the kernel's ephemeral range (32768-60999 here), from which every outgoing connection takes its
# local port: a port picked from that range (bind to port 0) was taken by some connection before the operator
# could bind it (seen in CI: EADDRINUSE on its health port). Above Ray's worker ports (10002-19999) and below
# Kubernetes' NodePorts (30000-32767).
_PORTS = range(20000, 30000)
_given: set[int] = set()  # never the same port twice in a process (two picks before either is bound)


def free_port() -> int:
    """A port that nothing listens on now, on any address, not given before in this process."""
    for _ in range(200):
        port = random.choice(_PORTS)
        if port in _given:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            _given.add(port)
            return port
    raise RuntimeError(f"no free port in {_PORTS.start}-{_PORTS.stop - 1} after 200 tries")
