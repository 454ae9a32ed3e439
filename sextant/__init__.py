"""sextant: measure, plan and choose a distributed-training stack on your own workload.

Importing this package never imports an ML framework; backends are imported inside the
worker process that runs them.
"""

__version__ = "0.1.0"
