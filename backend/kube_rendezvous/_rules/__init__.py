"""Pure state and rules: values in, values out; no request, no thread, no clock read."""
