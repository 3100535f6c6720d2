"""Contracts shared by the gateway and the supervisor: the fleet file, the Infernet-style
daemon JSON, VRAM tiers and GPU discovery. Neither side imports the other; both import this."""
