"""Loaded by every gage-eval subprocess of the reliability tests (through PYTHONPATH).

An audit hook records what the process must never do: open a watched path (files outside
the data folders that a hostile row points at) or touch the network (any socket connect or
name lookup, but the
tests' own servers on loopback). Violations are appended to the file named by GAGE_GUARD_LOG.
"""
import os
import sys

_LOG = os.environ.get("GAGE_GUARD_LOG")
_LOCAL = ("127.0.0.1", "::1", b"127.0.0.1")
_WATCH = tuple(p for p in os.environ.get("GAGE_GUARD_WATCH", "").split(os.pathsep) if p)


def _note(what: str) -> None:
    try:
        with open(_LOG, "a", encoding="utf-8") as fh:
            fh.write(what + "\n")
    except OSError:
        pass


def _hook(event, args):
    if event == "open" and _WATCH and args and isinstance(args[0], (str, bytes)):
        path = os.fsdecode(args[0])
        full = os.path.realpath(path)
        if any(full == w or full.startswith(w.rstrip(os.sep) + os.sep) for w in _WATCH):
            _note(f"open {full}")
    elif event == "socket.connect":
        address = args[1] if len(args) > 1 else None
        # a unix socket path and the tests' own servers on loopback are local; anything else is network
        if not isinstance(address, (str, bytes)) and not (isinstance(address, tuple) and address[0] in _LOCAL):
            _note(f"connect {address!r}")
    elif event == "socket.getaddrinfo" and args[0] not in _LOCAL:
        _note(f"getaddrinfo {args[0]!r}")


if _LOG:
    sys.addaudithook(_hook)
