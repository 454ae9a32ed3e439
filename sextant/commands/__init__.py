"""Sub-commands of the CLI, one module each (`register(subparsers)`)."""
