"""The executor: run one program under limits in an isolated, forked child (the mechanism).

Layout, from the service down to the program:

- ``compiler``: a request in any language of the table (``languages``) as the executions it
  takes on a slot: a compile (once per program and node: ``compile_cache``), then the run;
- ``pool``: the slots of a node, started together and checked against the required isolation;
- ``slot``: the service's handle on one zygote process (``docker_backend`` runs it in a
  container instead): start, canary, one execution at a time, restart;
- ``protocol``: what travels between them (``ZygoteConfig``, ``StartReport``, ``RunSpec``,
  ``Outcome``) and the frames it travels in; ``payload``: the zygote's wiped buffer for the
  bytes of an execution;
- ``zygote``: the process itself and its serve loop, one execution at a time: fork, watch,
  clean up, judge;
- ``startup``: the zygote's start-up: its own namespaces, which layers work, the preloads
  (``isolation``, ``seccomp_filter``, ``ipc`` and ``memory`` hold the confinement steps);
- ``monitor``: the parent's side of one execution: pipes, wall clock, capped output;
- ``child``: the child's side: confine itself, then run the program like ``python -c``, or
  exec a command in its place (another language's compiler, program or runtime);
- ``judge``: the status, from what the zygote observed itself;
- ``workdir``: each execution's working directory, and the reset after it (``wipe``).

The executor enforces the limits it is given and decides nothing about what is allowed: that
is the API's policy.

This package's ``__init__`` stays empty on purpose: the zygote imports it, and everything
imported here would be copied into every forked child.
"""
