"""Job code run through service.job_child that leaves processes behind: each function starts a
grandchild that would sleep for ten minutes, writes its pid to `pid_file`, then returns, raises
or hangs. After the job ends, the grandchild must be gone."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def _leave_grandchild(pid_file: str, how: str) -> int:
    if how == "fork":
        pid = os.fork()
        if pid == 0:
            time.sleep(600)
            os._exit(0)
    else:
        pid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid
    Path(pid_file).write_text(str(pid))
    return pid


def returns(pid_file: str, how: str) -> int:
    return _leave_grandchild(pid_file, how)


def raises(pid_file: str, how: str) -> int:
    _leave_grandchild(pid_file, how)
    raise SystemExit(5)


def hangs(pid_file: str, how: str) -> int:
    _leave_grandchild(pid_file, how)
    time.sleep(600)
    return 0


def where_am_i() -> dict[str, int]:
    """The child's pid, parent, process group and session."""
    return {"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0), "sid": os.getsid(0)}


def cuda_poisoned() -> bool:
    """Whether torch refuses CUDA here as in a child forked after a CUDA probe."""
    import torch

    return bool(torch.cuda._is_in_bad_fork())


def cuda_sum() -> float:
    """Touches CUDA: fails in a child torch calls a bad fork."""
    import torch

    return float(torch.ones(4, device="cuda").sum().item())
