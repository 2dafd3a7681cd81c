"""SpecSteer SDK: personalized generation on the device, steered by a cloud Generalist.

The private history never leaves the device: only drafted token ids go up, and the device adds
its private term to the companion's sparse verdict locally.
"""

from __future__ import annotations

__version__ = "0.1.0"
