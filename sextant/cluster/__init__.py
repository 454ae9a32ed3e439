"""Clusters sextant runs on: emulated ones on this machine (network namespaces with shaped
links) and real ones reached through Slurm or a torchrun-style launcher."""
