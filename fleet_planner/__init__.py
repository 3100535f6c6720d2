"""Capacity planner: how many GPUs a model needs, which layout, and a fleet file that runs it."""
