"""What crosses the socket, at both ends: the RESP codec (`resp`), the mappings large values are received into and
their pool (`valuepool`), and a value's memory handed to a same-node client as a sealed memfd (`shared_memory`).

Standard library only, and imports nothing else of strata_kv: the client (and with it the vLLM tier inside an
engine) uses it as the server does.
"""
