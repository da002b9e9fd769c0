"""One repository per storage concern, each usable alone over the shared `RepoBase`;
`db.store.Store` combines them over one engine."""
from ._base import RepoBase
from .artifacts import ArtifactRepo
from .devices import DeviceRepo
from .helion import HelionRepo
from .jobs import JobRepo
from .kernels import KernelRepo
from .records import RecordRepo
from .transfer import TransferRepo
from .trials import TrialRepo

__all__ = ["RepoBase", "ArtifactRepo", "DeviceRepo", "HelionRepo", "JobRepo", "KernelRepo", "RecordRepo", "TrialRepo", "TransferRepo"]
