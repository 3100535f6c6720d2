"""The ``vllm-fleet`` command: one entry point over the gateway and the supervisor."""
