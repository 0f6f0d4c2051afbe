"""The RESP server: listeners (`listeners.KVServer`), one connection per client (`connection`), the command table
(`commands`, `connection_commands`), who may connect (`admission`), reading and large values (`intake`,
`inflight`), writing replies (`output`, `senders`, `cpus`), INFO and /metrics (`info`, `metrics`) and the state
commands share (`state`).

Builds on `store` and `wire`; imported by nothing but the CLI.
"""
