"""``jetwake.engine``: the folder engine/, linked into the package as jetwake/engine.

Imported by the folder's own name from the repository root, it would be a second copy of every
module, with classes unequal to jetwake.engine's (two ``DAG`` classes, two registries), so that
import fails here, naming the right one.
"""
if __name__ != "jetwake.engine":
    raise ImportError(f"{__name__!r} is the folder engine/ of the jetwake repository; "
                      f"import it as 'jetwake.engine' (pip install -e .)")
