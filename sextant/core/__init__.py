"""The ground floor: errors, paths, defaults, files, keys, devices, environments and the
declared-field vocabulary; nothing here knows a workload, a strategy or a framework."""
