"""sandbox-service: fast, isolated execution of model-written Python for agentic RL.

Kept free of imports: the zygote imports this package, and what it imports is forked with
every execution.
"""

__version__ = "0.1.0"
