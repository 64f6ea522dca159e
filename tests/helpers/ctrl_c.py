"""Starting a child that a test stops with Ctrl-C (SIGINT).

A shell that runs the suite in the background (`make test &`, a CI runner without job control) starts it with
SIGINT ignored, and a child inherits an ignored signal across exec: its Python would never raise
KeyboardInterrupt, and a Ctrl-C test would fail for its launcher's sake. A handled signal, by contrast, is
reset to its default on exec, where Python installs its KeyboardInterrupt handler, as in a terminal."""

import signal
import subprocess


def popen_interruptible(args, **kwargs) -> subprocess.Popen:
    """subprocess.Popen(args, **kwargs), the child starting with SIGINT at its default."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(args, **kwargs)
    finally:
        signal.signal(signal.SIGINT, previous)
