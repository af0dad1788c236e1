"""Daydream-style estimation (DESIGN.md §6): task graphs from profiler traces or from dlcc plans,
transformed by what-if optimizations and replayed to predict their effect."""
