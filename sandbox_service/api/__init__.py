"""The HTTP front: the native API, health and metrics, and the compatibility fronts (``app``
wires them)."""
