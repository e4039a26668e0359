"""sandbox-service: fast, isolated execution of model-written Python for agentic RL.

A request's path, each box naming its module (``sandbox_service.`` omitted):

    HTTP ─ api/native (or a front: api/sandboxfusion, api/codejudge; api/policy: the limits)
      │      sessions: session_replay + cell_program (runs cell_driver in the sandbox)
      ▼
    queue ─ embedded (serve): queue/local ···················· runtime/embedded
      │     redis (api):      queue/redis/producer ═ Redis ═ queue/redis/consumer
      ▼                       (runtime/redis)                   (worker_node)
    slot loop ─ slot_loop: one task per slot takes a job, runs it, answers it
      ▼
    slot ─ executor/slot, executor/pool ─▶ zygote ─ executor/zygote ─▶ child (confined, run)
      ▼
    result ─ models.ExecuteResult ◀ back the same way (Redis: reply stream, producer)

Kept free of imports: the zygote imports this package, and what it imports is forked with
every execution.
"""

__version__ = "0.1.0"
