"""The deployment leg: the trained model exported through each framework's own exporters,
each artifact served in a fresh process and measured (sextant.deploy.matrix)."""
