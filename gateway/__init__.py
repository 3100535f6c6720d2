"""The vllm-fleet gateway: one OpenAI-compatible endpoint in front of many vLLM servers.

It never imports the supervisor; its only input is a config file (Infernet-style JSON or a fleet
file) plus ``FLEET_*`` environment variables.
"""
