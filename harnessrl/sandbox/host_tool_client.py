#!/usr/bin/env python3
"""Runs inside a sandbox, as `/run/harnessrl/tools/<tool> <words...>`: asks the host tool socket beside it and
prints its answer (harnessrl/sandbox/host_tools.py). Standard library only: it runs on the sandbox's Python."""

import json
import os
import socket
import sys


def main() -> int:
    here = os.path.dirname(os.path.abspath(sys.argv[0]))
    tool = os.path.basename(sys.argv[0])
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(60)
        s.connect(os.path.join(here, "host.sock"))
        s.sendall(json.dumps({"tool": tool, "argv": sys.argv[1:]}).encode() + b"\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    out = b"".join(chunks).decode(errors="replace")
    print(out)
    return 1 if out.startswith("Error:") else 0


if __name__ == "__main__":
    sys.exit(main())
