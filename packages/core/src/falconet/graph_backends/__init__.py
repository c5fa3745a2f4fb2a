"""The core's graph backends: ``eager`` (the reference step) and ``compile``."""
