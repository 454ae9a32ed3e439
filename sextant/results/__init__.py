"""The embedded results store (SQLite) and exports."""
