"""Tools an agent calls during a rollout: a sandboxed process runtime (``sandbox``) and its seccomp filter."""
