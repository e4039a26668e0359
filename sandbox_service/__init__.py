"""sandbox-service: fast, isolated execution of model-written Python for agentic RL.

A request's path, each box naming its module (under ``sandbox_service``):

    HTTP ──── api/native, or a front (api/sandboxfusion, api/codejudge); limits: api/policy;
     │        a session's cells: session_replay → cell_program (cell_driver runs in the child)
     ▼
    queue ─── embedded: queue/local (runtime/embedded)
     │        Redis:    queue/redis/producer (runtime/redis) ═ Redis ═ queue/redis/consumer
     ▼                                                                  (worker_node)
    slot loop ─ slot_loop: one task per slot takes a job and answers it
     ▼
    slot ──── executor/slot (executor/pool) ─▶ zygote: executor/zygote ─▶ child: confined,
     │        run and judged in executor/ (its docstring maps the modules)
     ▼
    result ── models.ExecuteResult, back the same way (Redis: the node's reply stream)

Kept free of imports: the zygote imports this package, and what it imports is forked with
every execution.
"""

__version__ = "0.1.0"
