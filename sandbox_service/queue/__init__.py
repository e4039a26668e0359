"""Transports between API nodes and slots: ``local`` (embedded) and ``redis`` (scale-out), both
behind the interfaces of ``base``."""
