"""colad: a Kubernetes device plugin that advertises files in a directory as devices."""

__version__ = "0.1.0"
