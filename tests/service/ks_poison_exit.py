"""A module that exits on import, as `unittest.__main__` or a package's `__main__` does: a job
naming it must fail alone, its worker living on (issue 33.1)."""
import sys

sys.exit(3)
