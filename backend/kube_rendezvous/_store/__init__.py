"""The key/value store on RendezvousKey objects: keys, bundles, combining adds, the round view."""
