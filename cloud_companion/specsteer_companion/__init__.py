"""SpecSteer cloud companion: verification and sparse recovery for devices; never sees the private context."""
