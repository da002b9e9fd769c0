"""A module whose import kills the process importing it (a segfault): a job naming it must fail
alone, its worker living on (issue 33.1)."""
import os
import signal

os.kill(os.getpid(), signal.SIGSEGV)
