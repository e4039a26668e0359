"""The HTTP front: native API, health and metrics, and (later) compatibility fronts."""

from sandbox_service.api.app import create_app

__all__ = ["create_app"]
