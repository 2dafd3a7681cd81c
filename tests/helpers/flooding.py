"""The distributed flood of issue 28 (`bench/flood.py`) as the lock-out tests use it."""

from __future__ import annotations

import resource
import sys
from pathlib import Path
from types import ModuleType

# (addresses, sockets per address): 13 addresses took a 256-descriptor companion (0 of 12
# logins), 1,100 sockets from 40 addresses the default caps (0 of 10)
ULIMIT_256 = (13, 32)
DEFAULTS = (40, 28)


def flood_module() -> ModuleType:
    """`bench/flood.py`: silent sockets from many loopback addresses, reopened when dropped."""
    bench = str(Path(__file__).resolve().parents[2] / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import flood

    return flood


def descriptors_for(needed: int) -> None:
    """This process holds the flood's sockets: raise its soft `ulimit -n` to fit them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == resource.RLIM_INFINITY or hard >= needed, \
        f"the flood needs {needed} descriptors here; the hard limit is {hard}"
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
