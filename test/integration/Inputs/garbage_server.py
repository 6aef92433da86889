"""Listens on 127.0.0.1:PORT for at most SECONDS and answers every
connection with random bytes: a program that is not hflow's store on the
rendezvous port. Forks into the background and prints its pid once it
listens.

    garbage_server.py PORT SECONDS
"""
import os
import socket
import sys
import time

port, seconds = int(sys.argv[1]), float(sys.argv[2])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(8)
pid = os.fork()
if pid:
    print(pid, flush=True)
    sys.exit(0)
os.setsid()
# Let the caller's $(...) end: no descriptor of its pipe stays open here.
devnull = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(devnull, fd)
end = time.time() + seconds
s.settimeout(0.5)
while time.time() < end:
    try:
        c, _ = s.accept()
        c.sendall(os.urandom(4096))
        time.sleep(0.1)
        c.close()
    except OSError:
        pass
