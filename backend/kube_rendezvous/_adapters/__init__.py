"""The framework adapters: tensorplay's handler (``handler``) and torch's (``torchrun``), each a thin layer on the
engine; what the engine needs of a framework is ``_engine.frameworks``."""
