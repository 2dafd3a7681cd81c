"""SpecSteer cloud companion: verification and sparse recovery for devices.

It never sees the private context: only public prompt ids and drafted ids arrive here.
"""
