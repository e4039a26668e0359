"""What runs behind the routes of an API process: one runtime per mode, side by side.

``base`` (the interface and the published limits), ``embedded`` (``serve``: queue and slots
in-process), ``redis`` (``api``: a Redis queue; worker nodes run the jobs).
"""
