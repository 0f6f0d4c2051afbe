"""The pod admission webhook, whole: `admission` (the HTTPS server and its pure decisions), `wiring` (the pure
pod patch that mounts a model and wires a KV tier), `gates` (kopf side: start the server, lift the model-ready
gate), `certificates` (pure: issue and check the serving certificate) and `certificate_keeper` (keep it in its
Secret, files and caBundles when the operator owns it)."""
