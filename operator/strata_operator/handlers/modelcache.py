"""kopf handlers for the modelcache resource (thin: parse spec, build children, apply, set status)."""
