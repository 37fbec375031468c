"""The engine: the folder (the one writer), the native handler, the compare-and-swap backend, the connection,
what the engine needs of a framework, and the process-wide registry."""
