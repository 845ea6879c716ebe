"""Colibri's build layer: where the engine's files are, target profiles, host identity,
kernel rendering and the one SCons runner.

Layers point one way: colibri_build <- colibri (the engine binding) <- tuner. This
package imports neither of the others, nor numpy: SConstruct and the binding import it
on every build and first load (see docs/ARCHITECTURE.md).
"""
