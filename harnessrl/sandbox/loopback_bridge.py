"""A loopback TCP port inside the sandbox that leads to the gateway's Unix socket; runs a command beside it.

A CLI agent whose HTTP client cannot speak over a Unix socket (Codex: a base URL is all it takes) reaches the
gateway through this bridge: it listens on `127.0.0.1:PORT` in the sandbox's own network namespace (nothing
else is there: the sandbox has no network) and pipes each connection to the socket the sandbox binds in
(`/run/harnessrl/gateway.sock`, forwarded to the gateway by `forward.UnixForwarder` on the host). It then runs
the command as its child and exits with the child's status.

It also bounds the agent by model calls: it reads the HTTP requests passing through (request line, headers,
`Content-Length` body) and when a request to a path ending in `--count-suffix` would be the `--max-requests`+1-th,
it holds that request, stops the child and its processes (SIGTERM to its group, then SIGKILL) and prints
`BUDGET_MARK` on stderr — nothing of that call reaches the gateway. A request it cannot delimit (a chunked body)
ends the counting for that connection, never the traffic.

Standard library only, Python >= 3.8: it runs under the sandbox's `python3`, bound read-only into the sandbox.

    python3 loopback_bridge.py --listen 127.0.0.1:8765 --socket /run/harnessrl/gateway.sock \
        [--max-requests N --count-suffix /responses] -- COMMAND ...
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading

BUDGET_MARK = "harnessrl-bridge: model-call budget reached"
COUNT_MARK = "harnessrl-bridge: model calls:"
CHUNK = 1 << 16
MAX_HEAD = 1 << 20  # request line + headers


class Budget:
    def __init__(self, limit: int | None, suffix: str) -> None:
        self.limit, self.suffix = limit, suffix
        self.count = 0
        self.reached = threading.Event()
        self.lock = threading.Lock()

    def admit(self, head: bytes) -> bool:
        """Counts a request whose path ends with the suffix; False when it would go over the limit."""
        try:
            path = head.split(b"\r\n", 1)[0].split(b" ")[1].decode("latin-1")
        except IndexError:
            return True
        if not path.split("?", 1)[0].endswith(self.suffix):
            return True
        with self.lock:
            if self.limit is not None and self.count >= self.limit:
                self.reached.set()
                return False
            self.count += 1
            return True


def _content_length(head: bytes) -> int | None:
    """The body's length from the headers; None when it cannot be known (chunked)."""
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding" and value.strip().lower() != b"identity":
            return None
        if name == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                return None
    return length


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _requests(client: socket.socket, upstream: socket.socket, budget: Budget) -> None:
    """Client -> gateway, request by request, each counted before it is passed on."""
    buf = b""
    try:
        while True:
            while b"\r\n\r\n" not in buf:
                if len(buf) > MAX_HEAD:
                    upstream.sendall(buf)
                    return _pipe(client, upstream)  # not HTTP as we know it: pass through
                data = client.recv(CHUNK)
                if not data:
                    if buf:
                        upstream.sendall(buf)
                    return
                buf += data
            end = buf.index(b"\r\n\r\n") + 4
            head = buf[:end]
            if not budget.admit(head):
                return
            length = _content_length(head)
            if length is None:
                upstream.sendall(buf)
                return _pipe(client, upstream)
            want = end + length
            while len(buf) < want:
                data = client.recv(CHUNK)
                if not data:
                    break
                buf += data
            upstream.sendall(buf[:want])
            buf = buf[want:]
    except OSError:
        pass
    finally:
        try:
            upstream.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _serve(client: socket.socket, path: str, budget: Budget) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
    back.start()
    _requests(client, upstream, budget)
    if budget.reached.is_set():
        for s in (client, upstream):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
    back.join()
    client.close()
    upstream.close()


def _accept(listener: socket.socket, path: str, budget: Budget) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_serve, args=(client, path, budget), daemon=True).start()


def _stop(child: subprocess.Popen) -> None:
    """Stops the child's whole process group (a shell's children too), SIGTERM then SIGKILL."""
    if child.poll() is not None:
        return
    try:
        os.killpg(child.pid, signal.SIGTERM)
        child.wait(5)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
    except OSError:
        pass


def _say(line: str) -> None:
    """One line on stderr in one write: the child's processes share the stream and must not split it."""
    os.write(2, (line + "\n").encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="loopback_bridge")
    parser.add_argument("--listen", required=True, help="HOST:PORT inside the sandbox")
    parser.add_argument("--socket", required=True, help="the gateway's Unix socket inside the sandbox")
    parser.add_argument("--max-requests", type=int, default=None)
    parser.add_argument("--count-suffix", default="/responses")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run")
    host, _, port = args.listen.rpartition(":")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, int(port)))
    listener.listen(64)
    budget = Budget(args.max_requests, args.count_suffix)
    threading.Thread(target=_accept, args=(listener, args.socket, budget), daemon=True).start()
    try:
        child = subprocess.Popen(command, start_new_session=True)
    except OSError as e:
        _say(f"harnessrl-bridge: cannot start {command[0]}: {e}")
        return 127
    signal.signal(signal.SIGTERM, lambda *_: _stop(child))
    threading.Thread(target=lambda: (budget.reached.wait(), _stop(child)), daemon=True).start()
    rc = child.wait()
    _say(f"{COUNT_MARK} {budget.count}")
    if budget.reached.is_set():
        _say(BUDGET_MARK)
        return 0
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main())
