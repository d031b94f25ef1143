"""Shared kernel infrastructure: argument checks, per-arch launch configs and SM counts, register budgets, rounding, tolerances, timing, and the compile check for GPUs that are not present."""
