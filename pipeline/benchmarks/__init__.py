"""Benchmarks offmeta did not write: Meta-World ML1 goal tasks recorded as canonical
datasets (``metaworld_record``) and rolled out in the simulator (``metaworld_env``).

Each module imports its simulator lazily; none is a dependency of offmeta (metaworld is in
the ``test`` extra and in the throwaway environment ``data/samples/regenerate_metaworld.sh``
creates).
"""
