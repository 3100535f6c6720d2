"""Starts one vLLM server per GPU group and the gateway, restarts them with backoff, and stops
whole process groups (DESIGN §1). Knows only the fleet file and how to spawn; never imports the
gateway."""
