"""SpecSteer lab: evaluation harness and demo, the one package that may import both sides.

The device SDK (`specsteer`) never imports the companion (`specsteer_companion`) and the
companion never imports this package; what needs both in one process lives here: `eval` (every
method of the papers on per-user data, through the real decoding loop and an in-process
companion) and `demo` (a real personalized email through the SDK and a companion subprocess).
Its command line is `specsteer-lab` (`specsteer_lab.cli`).
"""

from __future__ import annotations
