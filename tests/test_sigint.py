"""dlcc.sigint: a Ctrl-C that arrives while a worker is being spawned is delayed to the end of the
spawn, never raised inside it (a KeyboardInterrupt between starting a child and writing it its
start-up data leaves the child to die with a traceback of its own: EOFError in spawn_main)."""
import signal
import threading

import pytest

from dlcc import sigint


class _OtherThread:
    """A thread started before the spawn (as rich's progress refresher is), so that SIGINT is not
    blocked in it: the kernel may hand it the Ctrl-C sent to the process."""

    def __init__(self):
        self.go = threading.Event()
        self.t = threading.Thread(target=lambda: (self.go.wait(), signal.pthread_kill(threading.get_ident(),
                                                                                      signal.SIGINT)))
        self.t.start()

    def ctrl_c(self) -> None:
        self.go.set()
        self.t.join()


@pytest.fixture
def python_handles_ctrl_c():
    """Python's own SIGINT handler (KeyboardInterrupt), as in a terminal: a run started in the
    background of a non-interactive shell has SIGINT ignored, and Python then leaves it so."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_a_ctrl_c_taken_by_another_thread_waits_for_the_spawn_to_end(python_handles_ctrl_c):
    reached = []
    with pytest.raises(KeyboardInterrupt):
        other = _OtherThread()
        with sigint.blocked_while_spawning():
            other.ctrl_c()
            for i in range(1000):  # bytecode on which Python would run a pending handler
                reached.append(i)
    assert len(reached) == 1000, "the KeyboardInterrupt was raised inside the spawn"


def test_without_a_ctrl_c_nothing_is_raised_and_the_handler_is_restored(python_handles_ctrl_c):
    before = signal.getsignal(signal.SIGINT)
    with sigint.blocked_while_spawning():
        pass
    assert signal.getsignal(signal.SIGINT) is before
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())


def test_a_ctrl_c_during_the_spawn_reaches_the_programs_own_handler():
    got = []
    before = signal.signal(signal.SIGINT, lambda s, f: got.append(s))
    try:
        other = _OtherThread()
        with sigint.blocked_while_spawning():
            other.ctrl_c()
            assert not got
        assert got == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_ctrl_c_during_the_spawn_under_the_default_action_ends_the_process():
    """SIGINT's default action (a program that set SIG_DFL) still ends the process, after the spawn."""
    import subprocess
    import sys

    code = ("import signal, threading\n"
            "from dlcc import sigint\n"
            "signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
            "go = threading.Event()\n"
            "t = threading.Thread(target=lambda: (go.wait(), signal.pthread_kill(threading.get_ident(), signal.SIGINT)))\n"
            "t.start()\n"
            "with sigint.blocked_while_spawning():\n"
            "    go.set(); t.join()\n"
            "    print('spawned', flush=True)\n"
            "print('not ended', flush=True)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGINT, (p.returncode, p.stdout, p.stderr)
    assert p.stdout == "spawned\n"


def test_a_ctrl_c_during_the_spawn_of_a_program_that_ignores_it_is_dropped():
    """A program that ignores SIGINT (`nohup`, a background job) still ignores it after a spawn."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        other = _OtherThread()
        with sigint.blocked_while_spawning():
            other.ctrl_c()
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
