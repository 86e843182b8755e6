# expect: error
# layers: seccomp netns
# Connects to a server listening on this machine's loopback.
import socket

def transform(grid):
    socket.create_connection(("127.0.0.1", $port), timeout=2).sendall(b"escaped")
    return [[1]]
