"""kopf handlers for the kvcachetier resource (thin: parse spec, build children, apply, set status)."""
