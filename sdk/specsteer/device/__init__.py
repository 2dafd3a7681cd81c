"""The device's decoding: one generation as a generator of tokens with provenance.

`loop` (decode, with the offline policy), `rounds` (one collaborative round, and the per-token
baselines), `drafting` (drafts and the pipelining bet), `offline` (policy and reconnects),
`events` (what a generation yields and counts). Settings live in `specsteer.settings`.
"""

from specsteer.device.events import DecodeStats, DevicePrompt, TokenEvent
from specsteer.device.loop import decode
from specsteer.device.offline import ModeChange, OfflinePolicy
from specsteer.device.rounds import s0_placed_on_device
from specsteer.settings import LOCAL_METHODS, METHODS, PRESETS, Params

__all__ = [
    "LOCAL_METHODS",
    "METHODS",
    "PRESETS",
    "DecodeStats",
    "DevicePrompt",
    "ModeChange",
    "OfflinePolicy",
    "Params",
    "TokenEvent",
    "decode",
    "s0_placed_on_device",
]
