"""The framework adapters, each owning what the library knows of its framework: tensorplay's (``tensorplay``: its
``Framework``; ``handler``: its ``k8s`` handler; ``backend``: the public ``create_backend``, tensorplay's by
default; ``launcher``: our launcher) and torch's (``torchrun``), with what both know alike (``elastic``). The
engine speaks its own ``_engine.frameworks.Framework``."""
