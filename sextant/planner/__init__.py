"""The analytical planner (placeholder; public API filled in below)."""
