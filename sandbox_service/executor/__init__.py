"""The executor: run one program under limits in an isolated, forked child (the mechanism).

Layout: ``zygote`` is the process that preloads modules and forks a confined child per
execution (``isolation`` and ``seccomp_filter`` hold the confinement steps, ``runner`` the
child's side, ``supervise`` the parent's side of one execution); ``slot`` is the service's
handle on one zygote (``docker_backend`` runs it in a container instead); ``pool`` holds the
slots. The executor enforces the
limits it is given and decides nothing about what is allowed: that is the API's policy.

This package's ``__init__`` stays empty on purpose: the zygote imports it, and everything
imported here would be copied into every forked child.
"""
