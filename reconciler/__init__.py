"""reconciler: a Kubernetes-style declarative job reconciler."""

__version__ = "0.1.0"
