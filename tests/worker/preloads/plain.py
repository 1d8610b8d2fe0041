"""Does nothing when imported but exist: a module fit for preloading."""
LOADED = True
